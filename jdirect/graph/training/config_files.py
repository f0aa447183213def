"""The named run configurations: `load_config` turns a NAME (a file of the
package's jdirect/graph/configs/, shipped in the wheel) or a .py file's path
into the `TrainConfig` its `get_config()` returns, with a one-line error for
every file that cannot be run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .config import TrainConfig, first_line

# The named run configurations, NAME.py: package data beside this package,
# so a source checkout and an installed wheel both have them.
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# Modules that configuration files of older versions import: where they went.
MOVED = {"jdirect.graph.config": "jdirect.graph.training"}


def load_config(name_or_path: str | Path | None = None, *, dataset: str | None = None,
                configs: Path = CONFIGS) -> TrainConfig:
    """The `get_config()` of `configs`/NAME.py, or of a .py file's path.

    None: the configuration named after `dataset` if `configs` has one, else
    "default". `configs`: the folder of named configurations (default:
    `CONFIGS`, the package's jdirect/graph/configs/). Not validated (apply
    flags first, then `validate`).

    Raises:
      ValueError: no such configuration (the message lists `configs`), or
        a file that cannot be run (a syntax error, a failing import, no
        get_config, get_config failing or not returning a TrainConfig):
        one line naming the file and the problem.
    """
    configs = Path(configs)
    if name_or_path is None:
        name_or_path = dataset if dataset and (configs / f"{dataset}.py").is_file() \
            else "default"
    name = str(name_or_path)
    # A name's hyphens are its file's underscores (planetoid-gcn: planetoid_gcn.py).
    path = Path(name) if name.endswith(".py") else configs / f"{name.replace('-', '_')}.py"
    if not path.is_file():
        known = sorted(p.stem for p in configs.glob("*.py"))
        raise ValueError(f"no configuration {name!r} (known: {known}, or a path to a .py file)")
    spec = importlib.util.spec_from_file_location(f"jdirect_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f"{path}, line {e.lineno}: {e.msg}") from None
    except Exception as e:
        if isinstance(e, ModuleNotFoundError) and e.name in MOVED:
            raise ValueError(f"{path}: {e.name} has moved; write 'from {MOVED[e.name]} "
                             "import TrainConfig'") from None
        raise ValueError(f"{path}: {first_line(e)}") from None
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"{path} has no get_config() function (it must define one that "
                         "returns a TrainConfig)")
    try:
        cfg = module.get_config()
    except Exception as e:  # TrainConfig(hiden=...): a misspelled setting, say
        raise ValueError(f"{path}: get_config() failed: {first_line(e)}") from None
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"{path}: get_config() must return a TrainConfig, got "
                         f"{type(cfg).__name__}")
    return cfg
