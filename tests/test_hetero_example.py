"""examples/hetero_sage.py: R-GraphSAGE learns the typed structure that a
features-only MLP and a GraphSAGE on the untyped graph cannot see, on the
seeded small graph."""

from __future__ import annotations

from test_examples import _example


def test_rsage_beats_the_mlp_clearly(capsys):
    accuracy = _example("hetero_sage.py").main(["--small", "--epochs", "4"])
    out = capsys.readouterr().out
    assert "test accuracy: R-GraphSAGE" in out
    assert accuracy["rsage"] > max(accuracy["mlp"], accuracy["sage"]) + 0.1, accuracy
    assert accuracy["mlp"] > 0.3, accuracy  # the features alone carry some signal (chance 0.2)
