"""A run's checkpoints: one file an epoch, verified, rotated, one writer a directory.

One step is one file, `epoch-00000007.npz`, of the package's one format
(format.py): every leaf of the state pytree (model, optimizer state, and a
learned embedding's HostTables and their optimizer's slots, streamed in
pieces) plus the epoch, the run's settings and the metric history in its
metadata. A step is written to a temporary file, fsynced, read back and
checked against the hashes taken while writing, and only then renamed into
place (directory.py): a name that exists was verified when it was written,
and a crash (kill -9, disk full) mid-save leaves at most a temporary file
that is never read.

A directory is written by one run at a time: a writable `Checkpoints`
holds an exclusive lock on it (`.jdirect-lock`) until `close()`, and a
second one is refused in one line naming the holder; read-only openers
(the other processes of a multi-process run, or a resume without saving)
take no lock, and list the directory again when a writer rotated away
the steps they were reading. What a killed save left is removed by the
next lock holder, and no other file is ever deleted but the rotated steps
of the same run settings. The lock, the steps and the temporaries are
names jdirect gives its own files: nothing else there is followed or
opened (directory.py).

Why not orbax: the state of this trainer is saved by one process; orbax's
asynchronous tensorstore writer hung for minutes on a read-only directory,
restored a flipped byte silently, and buried shape errors under event-loop
tracebacks. A checksummed single file with an atomic rename is simpler to
make safe, and streams host tables larger than memory could hold twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterator

from .._files import NotAFile
from . import format as fmt
from .directory import (DirectoryLock, check_checkpoint_dir, lock_for_writing, own_kind,
                        replace_own)
from .errors import CheckpointError
from .tables import reread_caches, restore_targets, restored_tree

_NAME = re.compile(r"^epoch-(\d{8})\.npz$")
# How many times a restore lists the directory again when the steps it
# listed were removed while it read them (a writer's rotation).
_LISTINGS = 3


class _NotAStep(Exception):
    """A checkpoint file of the format at a step's name that is no run's
    step (no run_config: a `save_tables` file)."""


def _step_path(directory: Path, epoch: int) -> Path:
    return directory / f"epoch-{epoch:08d}.npz"


def normalised_settings(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as a checkpoint stores it: as JSON stores it (tuples become
    lists), with a `data_dir` made absolute, symbolic links resolved and no
    trailing slash, so "data", "./data/" and "/home/u/data" are one directory."""
    config = json.loads(json.dumps(config))
    if isinstance(config.get("data_dir"), str):
        config["data_dir"] = os.path.realpath(os.path.expanduser(config["data_dir"]))
    return config


def _config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    saved = normalised_settings(saved)
    missing = object()
    keys = sorted(set(saved) | set(current))
    return [f"{k}: saved {saved.get(k, missing)!r}, now {current.get(k, missing)!r}"
            .replace(repr(missing), "(absent)")
            for k in keys if saved.get(k, missing) != current.get(k, missing)]


def _step_metadata(epoch: int, metadata: dict[str, Any]) -> dict[str, Any]:
    """A step's metadata (epoch, run_config, history), checked against the
    step's name `epoch`.

    Raises:
      _NotAStep: it has no run_config (a `save_tables` file at a step's name).
      fmt.Damaged: its fields are not a step's, or its epoch is another.
    """
    if "run_config" not in metadata:
        raise _NotAStep()
    saved, config, history = (metadata.get(k) for k in ("epoch", "run_config", "history"))
    if not (isinstance(config, dict) and isinstance(history, list)
            and all(isinstance(h, dict) for h in history)):
        raise fmt.Damaged("its metadata is not a step's (run_config an object, history a list "
                          "of objects)")
    if saved != epoch or type(saved) is not int:
        raise fmt.Damaged(f"it holds the step of epoch {saved!r}, not {epoch}")
    return metadata


class Checkpoints:
    """Saves a training-state pytree after each epoch and restores the newest good one.

    Args:
      directory: where the `epoch-XXXXXXXX.npz` files live; created if missing.
      run_config: JSON-serialisable dict of what determines the state and the
        data and what the history means (for the trainer:
        `jdirect.graph.io.checkpoint.resume_settings`; not the number of
        epochs, which a resumed run may raise). Saved with every step; a
        restore under a different one is refused, naming each setting that
        differs. Stored as `normalised_settings` makes it.
      keep: how many of the newest steps to keep (>= 1).
      read_only: never write: restore works, `save` raises; no lock is
        taken, so the processes of a multi-process run other than the one
        that saves open the directory this way. Without it the directory is
        checked as by `check_checkpoint_dir`, so a run fails before training
        rather than at its first save, and locked until `close()`.

    Raises:
      CheckpointError: see `check_checkpoint_dir` (the directory cannot be
        created or written, is in use by another run, or read_only=True and
        it does not exist).
      TypeError/ValueError: run_config not a JSON-serialisable dict; keep < 1.
    """

    def __init__(self, directory: str | Path, run_config: dict[str, Any], *, keep: int = 2,
                 read_only: bool = False):
        if not isinstance(run_config, dict):
            raise TypeError(f"run_config must be a dict, got {type(run_config).__name__}")
        self._config = normalised_settings(run_config)
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self._keep = keep
        self._read_only = bool(read_only)
        self._lock: DirectoryLock | None = None
        self._vetted = False  # the steps already there were checked to be of this run_config
        if self._read_only:
            self._dir = check_checkpoint_dir(directory, read_only=True)
            return
        self._dir = Path(directory).absolute()
        self._lock = lock_for_writing(self._dir, "read_only=True")

    @property
    def directory(self) -> Path:
        return self._dir

    def epochs(self) -> list[int]:
        """Epochs of the entries named like steps in the directory, ascending
        (what is at such a name is checked when it is read)."""
        if not self._dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self._dir.iterdir() if (m := _NAME.match(p.name)))

    def restore_latest(self, target: Any) -> tuple[Any, dict[str, Any]] | None:
        """The newest intact step, shaped like `target`; None if there is none.

        Args:
          target: a pytree with the structure, shapes and dtypes of the saved
            state (e.g. `nnx.state((model, optimizer))`); restored array
            leaves take each target leaf's sharding (NumPy leaves stay
            NumPy); HostTable leaves (open, writable) are filled in place,
            and a CachedTable's device rows are read again from its table
            (the same object is returned, serving the restored rows).

        Returns:
          (state, meta): `state` has target's structure; `meta` holds
          "epoch", "history" (list of dicts) and "path" (the file used).
          A damaged newest step (unreadable, cut, crafted, checksum
          mismatch, non-finite values: any failure to read it) is skipped
          with a RuntimeWarning naming it, and the next older one is tried
          (its tables overwrite what the damaged one had written of them).
          Steps removed while they are read (a writer's rotation, seen by
          a read-only opener) are looked for again in a new listing, up to
          3 listings.

        Raises:
          CheckpointError: a HostTable of target is closed or read-only, a
            CachedTable closed or made by `CachedTable.of_uncached`, or a
            PartitionedCache in it (nothing is written); a step is of another format (named: it is not read);
            a symbolic link, directory, FIFO or device is at a step's name,
            or a checkpoint that is no run's step (a save_tables file):
            named, not read; the saved run_config differs (the message
            names each setting, saved and now), the state's structure,
            shapes or dtypes differ from target's; every step is damaged
            (the message names the directory and says to move it aside to
            start over); or the steps were removed while read in every
            listing (the message says so).
        """
        if not self.epochs():
            return None
        names, leaves, treedef = restore_targets(target, f"a checkpoint of {self._dir}",
                                                 CheckpointError)
        try:
            return self._restore(names, leaves, treedef, target)
        finally:
            reread_caches(target)  # whatever of the tables was written

    def _restore(self, names: list[str], leaves: list[Any], treedef: Any,
                 target: Any) -> tuple[Any, dict[str, Any]] | None:
        """restore_latest's search, over at most _LISTINGS listings of the
        directory: a listing whose steps were all removed while they were
        read (a writer rotated them) is made again."""
        damaged: dict[str, str] = {}  # path: why, each warned of once
        for _ in range(_LISTINGS):
            epochs = self.epochs()
            if not epochs:
                break
            vanished = False
            for epoch in reversed(epochs):
                path = _step_path(self._dir, epoch)
                advice = (f"resume it with the jdirect that wrote it, or move {self._dir} "
                          "aside to start the run over")
                try:
                    with self._open_step(epoch, advice) as (reader, meta):
                        self._check_compatible(path, meta["run_config"], reader, names, leaves)
                        restored = reader.read(names, leaves, finite=True)
                except FileNotFoundError:  # rotated away by the writer since it was listed
                    vanished = True
                    continue
                except fmt.Damaged as e:
                    if str(path) not in damaged:
                        damaged[str(path)] = f"{path} is damaged ({e})"
                        warnings.warn(f"{damaged[str(path)]}; falling back to an older "
                                      "checkpoint", RuntimeWarning, stacklevel=3)
                    continue
                return restored_tree(target, treedef, restored), dict(
                    epoch=meta["epoch"], history=meta["history"], path=str(path))
            if not vanished:
                break
        else:
            raise CheckpointError(
                f"the steps of {self._dir} were removed while they were read, "
                f"{_LISTINGS} times over: a run writing into it rotates them; resume once it "
                "has ended")
        if not damaged:  # every step listed was removed, and none is left
            raise CheckpointError(f"the steps of {self._dir} were removed while they were "
                                  "read, and none is left")
        raise CheckpointError(
            f"no intact checkpoint in {self._dir}: " + "; ".join(damaged.values())
            + f". Move {self._dir} aside to start the run over.")

    @contextlib.contextmanager
    def _open_step(self, epoch: int, advice: str) -> Iterator[tuple[fmt.Reader, dict[str, Any]]]:
        """(reader, metadata) of the step of `epoch`, open while in the block.

        Raises:
          CheckpointError: what is at its name is not a step of this format:
            a symbolic link, directory or FIFO (not followed or opened); a
            save_tables file; a file of another format (`advice` says what
            to do).
          FileNotFoundError, fmt.Damaged: as `fmt.Reader`, or a damaged
            step's metadata.
        """
        path = _step_path(self._dir, epoch)
        try:
            reader = fmt.Reader(path, follow=False)
        except NotAFile as e:
            raise CheckpointError(str(e)) from None
        except fmt.OldFormat as e:
            raise CheckpointError(f"{path} is {e}: {advice}") from None
        with reader:
            try:
                meta = _step_metadata(epoch, reader.metadata)
            except _NotAStep:
                raise CheckpointError(
                    f"{path} is a checkpoint but no run's step (it has no run settings: a "
                    f"save_tables file?); move it out of {self._dir}") from None
            yield reader, meta

    def _check_compatible(self, path: Path, saved: dict[str, Any], reader: fmt.Reader,
                          names: list[str], leaves: list[Any]) -> None:
        self._check_settings(path, saved)
        diffs = reader.mismatches(names, leaves)
        if diffs:
            raise CheckpointError(
                f"{path} holds a state of another structure, shape or dtype ("
                + "; ".join(diffs) + f"). Use another checkpoint directory than {self._dir}, "
                "or move it aside.")

    def _check_settings(self, path: Path, saved: dict[str, Any]) -> None:
        diff = _config_diff(saved, self._config)
        if diff:
            raise CheckpointError(
                f"{path} was saved by a run with other settings (" + "; ".join(diff)
                + "): run with the saved settings to resume it, or give this run another "
                "checkpoint directory")

    def _vet_existing_steps(self) -> None:
        """Refuses to save into a directory holding steps of other settings
        or of another format, which rotation would delete, or anything else
        at a step's name (a link, a directory, a save_tables file). Steps too
        damaged to name their settings are taken as this run's
        (restore_latest fell back past them)."""
        for epoch in self.epochs():
            path = _step_path(self._dir, epoch)
            try:
                with self._open_step(epoch, "give this run another checkpoint directory, or "
                                     "move it aside") as (_, meta):
                    saved = meta["run_config"]
            except (OSError, fmt.Damaged):
                continue
            self._check_settings(path, saved)
        self._vetted = True

    def save(self, epoch: int, state: Any, history: list[dict[str, Any]]) -> None:
        """Writes `state` and `history` as the step of `epoch`, verified.

        `state`'s leaves are arrays or HostTables (streamed in pieces, as
        they are: call with no jitted step in flight that writes them). The
        file is written under a temporary name, fsynced, read back and
        compared leaf by leaf (SHA-256) before it is renamed into place;
        only then are older steps beyond `keep` removed, and steps of later
        epochs (an abandoned continuation, e.g. after falling back past a
        damaged step) too. So the newest verified step always survives.
        Only steps of this run_config are ever removed: the first save
        refuses a directory holding steps of other settings, or anything
        at a step's name that is not a step (a symbolic link, a directory,
        a save_tables file); rotation removes only regular files, and
        leaves anything else that appears at a step's name later with a
        RuntimeWarning naming it. The step is renamed over its name, never
        written through what is there.

        A state with NaN or infinite values is refused and nothing of it is
        kept, so the last good step stays the newest and a rerun resumes
        from it. A trainer should not get that far: it stops on a
        non-finite loss with its own message; this refusal is the backstop.

        Raises:
          CheckpointError: opened read_only; steps of other settings, or
            something that is no step, at steps' names in the directory
            (named); a leaf has NaN or infinite values (named; nothing of
            this step is kept); the write or its verification failed
            (nothing of this step is left behind; older steps are untouched).
          TypeError: history is not JSON-serialisable.
        """
        if self._read_only:
            raise CheckpointError(f"checkpoints in {self._dir} were opened read_only")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 10**8:
            raise ValueError(f"epoch must be an int in [0, 1e8), got {epoch!r}")
        if not self._vetted:
            self._vet_existing_steps()
        metadata = dict(epoch=epoch, run_config=self._config,
                        history=json.loads(json.dumps(history)))
        names, leaves, _ = fmt.flatten(state)
        final = _step_path(self._dir, epoch)
        entries: list[dict[str, Any]] = []
        try:
            replace_own(final, lambda f: entries.extend(
                fmt.write(f, names, leaves, metadata, finite=True)),
                check=lambda tmp: fmt.verify(tmp, entries))
        except fmt.NonFinite as e:
            raise CheckpointError(
                f"state leaf {e} (training diverged); epoch {epoch} is not saved and the "
                f"checkpoints in {self._dir} are kept") from None
        except NotAFile as e:
            raise CheckpointError(f"{e}; epoch {epoch} is not saved") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"saving epoch {epoch} to {final} failed ({e}); older "
                                  "checkpoints are untouched") from e
        older = [e for e in self.epochs() if e < epoch]
        later = [e for e in self.epochs() if e > epoch]
        for old in older[: max(0, len(older) + 1 - self._keep)] + later:
            self._remove(_step_path(self._dir, old), epoch)

    def _remove(self, path: Path, saved: int) -> None:
        """Removes the step file `path` as rotation does: only a regular
        file; anything else at a step's name (a directory, a link) is left
        with a RuntimeWarning naming it.

        Raises:
          CheckpointError: it cannot be removed (epoch `saved` is saved).
        """
        kind = own_kind(path)
        if kind is None:
            try:
                path.unlink(missing_ok=True)
                return
            except IsADirectoryError:  # made since own_kind looked
                kind = "a directory"
            except OSError as e:
                raise CheckpointError(f"epoch {saved} is saved, but removing the older step "
                                      f"{path} failed ({e.strerror or e})") from e
        warnings.warn(f"{path} is {kind}, not a step: rotation leaves it (only step files are "
                      f"removed); move it out of {self._dir}", RuntimeWarning, stacklevel=3)

    def close(self) -> None:
        """Releases the directory's lock (nothing is pending after `save`
        returns). Also done when the object is collected or the process ends."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
