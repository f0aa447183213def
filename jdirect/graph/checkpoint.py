"""Per-epoch checkpoints of model, optimizer and metric history (orbax)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from flax import nnx


class Checkpoints:
    """Saves after each epoch into `directory` (keeping the last two) and
    restores the newest one. Batches depend only on (seed, epoch), so a run
    resumed after epoch e continues exactly as if it had not stopped."""

    def __init__(self, directory: str | Path):
        self._manager = ocp.CheckpointManager(
            Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
        )

    def save(self, epoch: int, model: nnx.Module, optimizer: nnx.Optimizer,
             history: list[dict[str, Any]]) -> None:
        state = nnx.state((model, optimizer))
        self._manager.save(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            history=ocp.args.JsonSave(json.loads(json.dumps(history))),
        ))
        self._manager.wait_until_finished()

    def restore_latest(self, model: nnx.Module, optimizer: nnx.Optimizer) -> dict[str, Any] | None:
        """Loads the newest checkpoint into model and optimizer; None if none."""
        epoch = self._manager.latest_step()
        if epoch is None:
            return None
        target = nnx.state((model, optimizer))
        restored = self._manager.restore(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            history=ocp.args.JsonRestore(),
        ))
        nnx.update((model, optimizer), restored["state"])
        return dict(epoch=epoch, history=list(restored["history"]))

    def close(self) -> None:
        self._manager.close()
