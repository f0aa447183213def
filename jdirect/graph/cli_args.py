"""Command-line parsing shared by `jdirect-train` and the examples: a parser
whose refusals are one line, and range-checked number types.

    p = Parser(description="...", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=number(int, 1), default=4, help="passes over the data")
    args = p.parse_args(argv)   # --epochs 0: "prog: error: argument --epochs: expected an
                                # integer >= 1, got '0'", exit status 2
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, NoReturn


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose refusals are one line (status 2),
    without the usage block that --help shows."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def number(kind: type, low: float, high: float | None = None, *, open_low: bool = False,
           open_high: bool = False) -> Callable[[str], int | float]:
    """An argparse type: the text as `kind` (int or float), finite and within
    [low, high] (high None: no upper end; an end excluded where open).

    Raises (from the returned function):
      argparse.ArgumentTypeError: the text is not a `kind`, not finite, or
        out of range; the message names the range and the text.
    """
    if kind not in (int, float):
        raise TypeError(f"number() takes int or float, got {kind!r}")
    if high is None:
        bounds = f"{'>' if open_low else '>='} {low}"
    else:
        bounds = f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    expected = f"expected {'an integer' if kind is int else 'a finite number'} {bounds}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
        # nan passes every comparison below.
        if not math.isfinite(value) or value < low or (open_low and value == low) or (
                high is not None and (value > high or (open_high and value == high))):
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
        return value

    return parse
