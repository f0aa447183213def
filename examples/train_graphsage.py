"""The `jdirect-train` command from a source checkout (jdirect/graph/train.py; `--help`)."""

from jdirect.graph.train import command

if __name__ == "__main__":
    raise SystemExit(command())
