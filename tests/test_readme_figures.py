"""The README quotes its figures from benchmarks/RESULTS.md: each row of its
figure tables (workload | figure | device | date) names a device and a date,
and a row of the results page with that device and that date holds each part
of the figure (the parts split at "; ")."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (ROOT / "README.md").exists(),
                                reason="a wheel's test run has the tests without the checkout")
README, RESULTS = ((ROOT / name).read_text() if (ROOT / name).exists() else ""
                   for name in ("README.md", "benchmarks/RESULTS.md"))
FIGURE_TABLE = ["workload", "figure", "device", "date"]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of `text`: its rows (header first, no separator), as cells."""
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            found.append(rows)
            rows = []
    return found


def unquoted(readme: str, results: str) -> list[str]:
    """The README's figures that no dated row of the results page holds, and
    a line if the README has no figure table."""
    dated = [[cell.replace("**", "") for cell in row]
             for table in tables(results) for row in table[1:]]
    figures = [row for table in tables(readme) if table[0] == FIGURE_TABLE for row in table[1:]]
    problems = [] if figures else ["the README has no figure table"]
    for workload, figure, device, date in figures:
        rows = [" | ".join(row) for row in dated if device in row and date in row]
        problems += [f"{workload!r}: {part!r} on {device}, {date}" for part in figure.split("; ")
                     if not any(part in row for row in rows)]
    return problems


def test_every_readme_figure_is_on_a_dated_row_of_the_results_page():
    assert len([row for table in tables(README) if table[0] == FIGURE_TABLE
                for row in table[1:]]) >= 8
    assert unquoted(README, RESULTS) == []


def test_a_figure_off_the_page_or_of_another_date_is_named():
    row = "| 29.7 s | H200 | 2026-11-28 |"
    assert row in README
    assert unquoted(README.replace(row, "| 28.7 s | H200 | 2026-11-28 |"), RESULTS) == [
        "'layer-wise inference of all 111M `papers100m` nodes': '28.7 s' on H200, 2026-11-28"]
    assert unquoted(README.replace(row, "| 29.7 s | H200 | 2026-11-27 |"), RESULTS) == [
        "'layer-wise inference of all 111M `papers100m` nodes': '29.7 s' on H200, 2026-11-27"]
    assert unquoted("no tables", RESULTS) == ["the README has no figure table"]


def test_the_results_page_is_current_figures_with_commands_in_the_repository():
    # History lives in benchmarks/results/journal/; a command citing a
    # script outside the repository (.diag/) cannot be rerun.
    assert len(RESULTS.splitlines()) <= 120
    assert ".diag/" not in RESULTS
