"""Per-epoch checkpoints of a training state pytree, verified and rotated safely.

One step is one file, `epoch-00000007.npz`, holding every leaf of the state
as raw bytes plus a JSON header (format version, epoch, the run's
configuration, the metric history, and each leaf's path, shape, dtype and
SHA-256). A step is written to a temporary file, fsynced, read back and
checked against the in-memory hashes, and only then renamed into place: a
name that exists was verified when it was written, and a crash (kill -9,
disk full) mid-save leaves at most a temporary file that is never read.

Why not orbax: the state of this trainer is small and saved by one process;
orbax's asynchronous tensorstore writer hung for minutes on a read-only
directory, restored a flipped byte silently, and buried shape errors under
event-loop tracebacks. A checksummed single file with an atomic rename is
simpler to make safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._atomic import TMP_PREFIX, atomic_write

_FORMAT = 1
_NAME = re.compile(r"^epoch-(\d{8})\.npz$")
# Everything reading a damaged file can raise (zipfile wraps most header
# damage in BadZipFile; numpy raises ValueError; a cut file EOFError).
_DAMAGE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, TypeError)


class CheckpointError(ValueError):
    """A checkpoint directory cannot be used: damaged files, a configuration
    or state that differs from the saved one, or a directory that cannot be
    written. The message names the path and what to do."""


class _DamagedStep(CheckpointError):
    """One step file cannot be trusted; restore falls back past it."""


def _step_path(directory: Path, epoch: int) -> Path:
    return directory / f"epoch-{epoch:08d}.npz"


def _unkey(leaf: Any) -> tuple[Any, str]:
    """(leaf, "") or, for a typed PRNG key array, (its raw key data, impl name)."""
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf), str(jax.random.key_impl(leaf))
    return leaf, ""


def _spec(leaf: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) a leaf is stored with."""
    leaf = _unkey(leaf)[0]
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), str(leaf.dtype)


def _leaf_bytes(leaf: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """(contiguous host array, header entry without path) of one leaf."""
    leaf, impl = _unkey(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and leaf.is_fully_replicated:
        leaf = leaf.addressable_data(0)  # replicated across processes: any copy
    host = np.asarray(leaf, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    entry = dict(shape=list(host.shape), dtype=str(host.dtype), key_impl=impl,
                 sha256=hashlib.sha256(host.tobytes()).hexdigest())
    return host, entry


def _flatten(state: Any) -> tuple[list[str], list[Any]]:
    pairs = jax.tree.flatten_with_path(state)[0]
    return [jax.tree_util.keystr(p) for p, _ in pairs], [leaf for _, leaf in pairs]


def _read_step(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and the leaves of one step file, each leaf's hash checked.

    Raises:
      _DamagedStep: the file is unreadable, truncated or altered.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            if header.get("format") != _FORMAT:
                raise ValueError(f"unknown format {header.get('format')!r}")
            leaves = []
            for i, entry in enumerate(header["leaves"]):
                raw = z[f"leaf{i}"]
                if hashlib.sha256(raw.tobytes()).hexdigest() != entry["sha256"]:
                    raise ValueError(f"checksum mismatch in {entry['path']}")
                dtype = jnp.dtype(entry["dtype"])
                leaves.append(raw.view(dtype).reshape(entry["shape"]))
    except _DAMAGE as e:
        raise _DamagedStep(f"{path} is damaged ({type(e).__name__}: {e})") from e
    return header, leaves


def _config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    missing = object()
    keys = sorted(set(saved) | set(current))
    return [f"{k}: saved {saved.get(k, missing)!r}, now {current.get(k, missing)!r}"
            .replace(repr(missing), "(absent)")
            for k in keys if saved.get(k, missing) != current.get(k, missing)]


class Checkpoints:
    """Saves a training-state pytree after each epoch and restores the newest good one.

    Args:
      directory: where the `epoch-XXXXXXXX.npz` files live; created if missing.
      run_config: JSON-serialisable dict of what determines the state and the
        data (seed, dataset, model shape, optimiser, ...; not the number of
        epochs, which a resumed run may raise). Saved with every step; a
        restore under a different one is refused.
      keep: how many of the newest steps to keep (>= 1).
      read_only: never write: restore works, `save` raises. Without it the
        directory is checked to be creatable and writable here, so a run
        fails before training rather than at its first save.

    Raises:
      CheckpointError: the directory cannot be created or written (the
        message suggests read_only=True to resume without saving), or
        read_only=True and it does not exist.
      TypeError/ValueError: run_config not a JSON-serialisable dict; keep < 1.
    """

    def __init__(self, directory: str | Path, run_config: dict[str, Any], *, keep: int = 2,
                 read_only: bool = False):
        if not isinstance(run_config, dict):
            raise TypeError(f"run_config must be a dict, got {type(run_config).__name__}")
        # Round trip so comparisons see what JSON stores (tuples become lists).
        self._config = json.loads(json.dumps(run_config))
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self._dir = Path(directory).absolute()
        self._keep = keep
        self._read_only = bool(read_only)
        if self._read_only:
            if not self._dir.is_dir():
                raise CheckpointError(f"checkpoint directory {self._dir} does not exist "
                                      "(read_only=True only resumes)")
            return
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self._dir) as f:
                f.write(b"probe")
                f.flush()
                os.fsync(f.fileno())
            for stale in self._dir.glob(TMP_PREFIX + "*"):  # from a save that was killed
                stale.unlink()
        except OSError as e:
            raise CheckpointError(
                f"cannot write checkpoints to {self._dir} ({e.strerror or e}); choose a "
                "writable directory, or pass read_only=True to resume from it without "
                "saving") from e

    @property
    def directory(self) -> Path:
        return self._dir

    def epochs(self) -> list[int]:
        """Epochs of the committed steps in the directory, ascending."""
        if not self._dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self._dir.iterdir() if (m := _NAME.match(p.name)))

    def restore_latest(self, target: Any) -> tuple[Any, dict[str, Any]] | None:
        """The newest intact step, shaped like `target`; None if there is none.

        Args:
          target: a pytree with the structure, shapes and dtypes of the saved
            state (e.g. `nnx.state((model, optimizer))`); restored leaves
            take each target leaf's sharding (NumPy leaves stay NumPy).

        Returns:
          (state, meta): `state` has target's structure; `meta` holds
          "epoch", "history" (list of dicts) and "path" (the file used).
          A damaged newest step (unreadable, checksum mismatch, non-finite
          values) is skipped with a RuntimeWarning naming it, and the next
          older one is tried.

        Raises:
          CheckpointError: the saved run_config differs (the message lists
            the keys), the state's structure, shapes or dtypes differ from
            target's, or every step is damaged (the message names the
            directory and says to delete or move it to start over).
        """
        epochs = self.epochs()
        if not epochs:
            return None
        names, target_leaves = _flatten(target)
        treedef = jax.tree.structure(target)
        damaged = []
        for epoch in reversed(epochs):
            path = _step_path(self._dir, epoch)
            try:
                header, leaves = _read_step(path)
                self._check_compatible(path, header, names, target_leaves)
                bad = [e["path"] for e, x in zip(header["leaves"], leaves)
                       if jnp.issubdtype(x.dtype, jnp.inexact) and not np.isfinite(x).all()]
                if bad:
                    raise _DamagedStep(f"{path} has non-finite values in {bad[0]}")
            except _DamagedStep as e:
                damaged.append(str(e))
                warnings.warn(f"{e}; falling back to an older checkpoint", RuntimeWarning,
                              stacklevel=2)
                continue
            restored = [_to_target(x, e, t) for x, e, t in zip(leaves, header["leaves"],
                                                                target_leaves)]
            meta = dict(epoch=header["epoch"], history=header["history"], path=str(path))
            return jax.tree.unflatten(treedef, restored), meta
        raise CheckpointError(
            f"no intact checkpoint in {self._dir}: " + "; ".join(damaged)
            + f". Delete or move {self._dir} to start the run over.")

    def _check_compatible(self, path: Path, header: dict[str, Any], names: list[str],
                          target_leaves: list[Any]) -> None:
        diff = _config_diff(header["run_config"], self._config)
        if diff:
            raise CheckpointError(
                f"{path} was saved by a run with another configuration ("
                + "; ".join(diff) + f"). Use another checkpoint directory than {self._dir}, "
                "or delete it to start over.")
        saved = [(e["path"], tuple(e["shape"]), e["dtype"]) for e in header["leaves"]]
        want = [(name, *_spec(leaf)) for name, leaf in zip(names, target_leaves)]
        if saved != want:
            diffs = [f"{w[0]}: saved {s[1:]}, now {w[1:]}" for s, w in zip(saved, want) if s != w]
            if len(saved) != len(want):
                diffs.insert(0, f"{len(saved)} saved leaves, {len(want)} in the target")
            raise CheckpointError(
                f"{path} holds a state of another structure, shape or dtype ("
                + "; ".join(diffs[:5]) + (" ..." if len(diffs) > 5 else "")
                + f"). Use another checkpoint directory than {self._dir}, or delete it.")

    def save(self, epoch: int, state: Any, history: list[dict[str, Any]]) -> None:
        """Writes `state` and `history` as the step of `epoch`, verified.

        The file is written under a temporary name, fsynced, read back and
        compared leaf by leaf (SHA-256) before it is renamed into place;
        only then are older steps beyond `keep` removed, and steps of later
        epochs (an abandoned continuation, e.g. after falling back past a
        damaged step) too. So the newest verified step always survives.

        Raises:
          CheckpointError: opened read_only, or the write or its
            verification failed (nothing of this step is left behind;
            older steps are untouched).
          ValueError: a leaf has NaN or infinite values (not saved, so the
            last good step is kept).
          TypeError: history is not JSON-serialisable.
        """
        if self._read_only:
            raise CheckpointError(f"checkpoints in {self._dir} were opened read_only")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 10**8:
            raise ValueError(f"epoch must be an int in [0, 1e8), got {epoch!r}")
        names, leaves = _flatten(state)
        arrays, entries = {}, []
        for i, (name, leaf) in enumerate(zip(names, leaves)):
            host, entry = _leaf_bytes(leaf)
            if np.issubdtype(host.dtype, np.inexact) and not np.isfinite(host).all():
                raise ValueError(f"state leaf {name} has {int((~np.isfinite(host)).sum())} "
                                 f"non-finite values; epoch {epoch} is not saved")
            arrays[f"leaf{i}"] = host.reshape(-1).view(np.uint8)
            entries.append(dict(path=name, **entry))
        header = dict(format=_FORMAT, epoch=epoch, run_config=self._config,
                      history=json.loads(json.dumps(history)), leaves=entries)
        arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
        final = _step_path(self._dir, epoch)
        try:
            # _read_step raises if what reached the disk differs from `state`.
            atomic_write(final, lambda f: np.savez(f, **arrays), check=_read_step)
        except (OSError, _DamagedStep) as e:
            raise CheckpointError(f"saving epoch {epoch} to {final} failed ({e}); older "
                                  "checkpoints are untouched") from e
        older = [e for e in self.epochs() if e < epoch]
        later = [e for e in self.epochs() if e > epoch]
        for old in older[: max(0, len(older) + 1 - self._keep)] + later:
            _step_path(self._dir, old).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing is pending after `save` returns; kept for symmetry with a context manager."""

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _to_target(x: np.ndarray, entry: dict[str, Any], like: Any) -> Any:
    if entry["key_impl"]:
        x = jax.random.wrap_key_data(x, impl=entry["key_impl"])
    if isinstance(like, jax.Array):
        return jax.device_put(x, like.sharding)
    return x
