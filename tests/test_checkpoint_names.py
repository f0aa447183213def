"""The names jdirect gives its own files in a checkpoint directory (issue 51,
items 1, 2, 8, 9): a symbolic link, FIFO or directory planted at the lock,
a step or a temporary is refused in one line (or, for a temporary, never
opened) and its target is untouched; a directory or a save_tables file at a
step's name gets a clear error and rotation leaves it; a read-only restore
racing a writer's rotation lists the directory again."""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from jdirect.checkpoint import (CheckpointError, Checkpoints, TableCheckpointError,
                                check_checkpoint_dir, restore_tables, save_tables)
from jdirect.checkpoint import steps

CONFIG = dict(seed=0)
LOCK, STEP = ".jdirect-lock", "epoch-00000001.npz"
KINDS = ["symlink", "dangling symlink", "fifo", "directory"]
WORDS = {"symlink": "a symbolic link", "dangling symlink": "a symbolic link", "fifo": "a FIFO",
         "directory": "a directory"}


def state(value: float) -> dict:
    return dict(w=jnp.full((8, 4), value, jnp.float32))


def plant(path: Path, kind: str, victim: Path) -> None:
    """Something other than a file at `path`; a link points at `victim`."""
    if kind == "symlink":
        victim.write_text("the victim's data")
        path.symlink_to(victim)
    elif kind == "dangling symlink":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


def untouched(path: Path, kind: str, victim: Path) -> None:
    """`path` is still what `plant` made, and the victim as it was."""
    mode = os.lstat(path).st_mode
    assert {"fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR}.get(kind, stat.S_ISLNK)(mode)
    if kind == "symlink":
        assert victim.read_text() == "the victim's data"
    elif kind == "dangling symlink":
        assert not victim.exists()


def refusal(name: str, kind: str) -> str:
    return rf"{name} is {WORDS[kind]}, not a file: jdirect never follows or opens one"


@pytest.mark.parametrize("kind", KINDS)
def test_something_at_the_lock_is_refused_and_its_target_untouched(tmp_path, kind):
    # Regression: a symbolic link at .jdirect-lock made save_tables and every
    # run with --checkpoint-dir truncate the link's target and write the lock
    # record into it.
    d, victim = tmp_path / "d", tmp_path / "victim"
    d.mkdir()
    plant(d / LOCK, kind, victim)
    with jdirect.HostTable.copy_of(np.ones((4, 2), np.float32)) as table:
        with pytest.raises(TableCheckpointError, match=refusal(LOCK, kind)) as e:
            save_tables(d / "t.npz", table)
    assert "\n" not in str(e.value) and not (d / "t.npz").exists()
    with pytest.raises(CheckpointError, match=f"^{d / LOCK} is {WORDS[kind]}, not a file"):
        Checkpoints(d, CONFIG)
    with pytest.raises(CheckpointError, match=refusal(LOCK, kind)):
        check_checkpoint_dir(d)
    untouched(d / LOCK, kind, victim)


@pytest.mark.parametrize("kind", KINDS)
def test_something_at_a_step_name_is_refused_by_save_and_restore(tmp_path, kind):
    # Regression: a symbolic link at a step's name made Checkpoints.save
    # replace a file outside the checkpoint directory.
    victim = tmp_path / "victim"
    d = tmp_path / "d"
    ckpt = Checkpoints(d, CONFIG)
    ckpt.save(0, state(0), [])
    plant(d / STEP, kind, victim)
    with pytest.raises(CheckpointError, match=refusal(STEP, kind) + ".*epoch 1 is not saved$"):
        ckpt.save(1, state(1), [])
    untouched(d / STEP, kind, victim)
    with pytest.raises(CheckpointError, match=f"^{d / STEP} is {WORDS[kind]}, not a file"):
        ckpt.restore_latest(state(9))  # never followed, never opened (a FIFO would block)
    ckpt.close()
    with pytest.raises(CheckpointError, match=refusal(STEP, kind)):
        Checkpoints(d, CONFIG).save(2, state(2), [])  # a new run vets what is there
    untouched(d / STEP, kind, victim)
    assert ckpt.epochs() == [0, 1]


@pytest.mark.parametrize("kind", KINDS)
def test_something_at_a_temporary_name_is_never_opened(tmp_path, kind, monkeypatch):
    # Temporaries are created with O_EXCL: a name taken is skipped, whatever
    # is there, and a dead writer's name is removed only if it is a file.
    d, victim = tmp_path / "d", tmp_path / "victim"
    d.mkdir()
    planted = d / f".jdirect-tmp-{os.getpid()}-planted"
    dead = d / ".jdirect-tmp-999999999-planted"  # as if a killed writer's
    plant(planted, kind, victim)
    plant(dead, "directory" if kind == "directory" else "dangling symlink"
          if kind == "dangling symlink" else kind, tmp_path / "victim2")
    names = iter(["planted", "planted", "fresh0", "fresh1", "fresh2", "fresh3"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    with jdirect.HostTable.copy_of(np.ones((4, 2), np.float32)) as table:
        save_tables(d / "t.npz", table)
    ckpt = Checkpoints(d / "run", CONFIG)
    ckpt.save(0, state(0), [])
    ckpt.close()
    untouched(planted, kind, victim)
    assert os.path.lexists(dead)
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == ["run", "t.npz"]


def test_a_directory_at_a_later_step_is_refused_and_rotation_leaves_it(tmp_path):
    # Regression: the save succeeded, then rotation ended in a raw IsADirectoryError.
    later = tmp_path / "epoch-00000005.npz"
    later.mkdir()
    ckpt = Checkpoints(tmp_path, CONFIG)
    with pytest.raises(CheckpointError, match=f"^{later} is a directory, not a file"):
        ckpt.save(0, state(0), [])
    later.rmdir()
    ckpt.save(0, state(0), [])
    later.mkdir()  # made while the run goes on: the next rotation meets it
    with pytest.warns(RuntimeWarning, match=f"{later} is a directory, not a step: rotation "
                                            "leaves it"):
        ckpt.save(1, state(1), [])
    assert later.is_dir() and ckpt.epochs() == [0, 1, 5]
    with pytest.raises(CheckpointError, match=f"^{later} is a directory, not a file"):
        ckpt.restore_latest(state(0))
    ckpt.close()


def test_a_save_tables_file_at_a_step_name_is_named_not_a_traceback(tmp_path):
    # Regression: a raw KeyError; and rotation would have deleted it.
    ckpt = Checkpoints(tmp_path, CONFIG)
    ckpt.save(0, state(0), [])
    (tmp_path / "sub").mkdir()  # save_tables locks its directory: the run holds this one
    with jdirect.HostTable.copy_of(np.ones((8, 4), np.float32)) as table:
        save_tables(tmp_path / "sub" / "t.npz", dict(w=table))
    os.replace(tmp_path / "sub" / "t.npz", tmp_path / STEP)
    message = f"^{tmp_path / STEP} is a checkpoint but no run's step .*save_tables file"
    with pytest.raises(CheckpointError, match=message):
        ckpt.restore_latest(state(0))
    ckpt.close()
    with pytest.raises(CheckpointError, match=message):
        Checkpoints(tmp_path, CONFIG, keep=1).save(2, state(2), [])
    assert (tmp_path / STEP).exists()


def test_a_user_named_link_is_followed_but_a_fifo_is_refused(tmp_path):
    # Following is right for a path the user names; opening a FIFO is not.
    real = tmp_path / "real.npz"
    with jdirect.HostTable.copy_of(np.arange(8, dtype=np.float32)) as table:
        save_tables(real, table)
        (tmp_path / "link.npz").symlink_to(real)
        save_tables(tmp_path / "link.npz", table)
        assert (tmp_path / "link.npz").is_symlink()
        with jdirect.HostTable.copy_of(np.zeros(8, np.float32)) as target:
            restore_tables(tmp_path / "link.npz", target)
            np.testing.assert_array_equal(target.numpy(), table.numpy())
            os.mkfifo(tmp_path / "pipe")
            for name, kind in (("pipe", "a FIFO"), ("", "a directory")):
                with pytest.raises(TableCheckpointError, match=f"{kind}, not a file; nothing"):
                    restore_tables(tmp_path / name, target)


def test_a_read_only_restore_racing_rotation_lists_again(tmp_path, monkeypatch):
    # Regression: "no intact checkpoint in DIR ... Move DIR aside" while newer
    # intact steps were on disk. Here the writer rotates between the reader's
    # listing and its reads, twice.
    writer = Checkpoints(tmp_path, CONFIG, keep=2)
    for epoch in (0, 1):
        writer.save(epoch, state(epoch), [])
    reader = Checkpoints(tmp_path, CONFIG, read_only=True)
    real, rotations = Checkpoints.epochs, iter([2, 3, 4, 5])

    def listing_then_rotation(self):
        listed = real(self)
        if self is reader:
            for epoch in itertools.islice(rotations, 2):
                writer.save(epoch, state(epoch), [])
        return listed

    monkeypatch.setattr(Checkpoints, "epochs", listing_then_rotation)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored, meta = reader.restore_latest(state(0))
    assert meta["epoch"] == 5 and float(restored["w"][0, 0]) == meta["epoch"]
    monkeypatch.setattr(steps, "_LISTINGS", 1)
    rotations = iter(range(6, 10))
    with pytest.raises(CheckpointError, match=f"the steps of {tmp_path} were removed while "
                                              "they were read, 1 times over: a run writing"):
        reader.restore_latest(state(0))
    writer.close()


# -- a CachedTable restored (item 3) -------------------------------------------

def csr(rng, nodes: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    degrees = rng.integers(0, 6, nodes)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int32)
    return indptr, rng.integers(0, rows, int(indptr[-1])).astype(np.int32)


@pytest.mark.parametrize("cached", ["some", "every row"])
@pytest.mark.parametrize("how", ["restore_tables", "restore_latest"])
def test_a_restored_cached_table_reads_the_restored_rows(tmp_path, cached, how):
    # Regression: its host table was filled in place, but the cache handed
    # back new arrays: the object passed read old rows for cached ids.
    rng = np.random.default_rng(3)
    saved_rows = rng.standard_normal((40, 8)).astype(np.float32)
    old_rows = rng.standard_normal((40, 8)).astype(np.float32)
    ids = np.arange(40) if cached == "every row" else rng.choice(40, 15, replace=False)
    indptr, indices = csr(rng, 25, 40)
    with jdirect.HostTable.copy_of(saved_rows) as source, \
            jdirect.HostTable.copy_of(old_rows) as table:
        saved_cache, cache = jdirect.CachedTable(source, ids), jdirect.CachedTable(table, ids)
        tree = dict(emb=cache, step=np.int32(0))
        if how == "restore_tables":
            save_tables(tmp_path / "t.npz", dict(emb=saved_cache, step=np.int32(3)))
            out, _ = restore_tables(tmp_path / "t.npz", tree)
        else:
            ckpt = Checkpoints(tmp_path / "run", CONFIG)
            ckpt.save(0, dict(emb=saved_cache, step=np.int32(3)), [])
            out, _ = ckpt.restore_latest(tree)
            ckpt.close()
        assert out["emb"] is cache and int(out["step"]) == 3
        every = jnp.arange(40, dtype=jnp.int32)
        want = np.zeros((25, 8), np.float32)
        for n in range(25):
            want[n] = saved_rows[indices[indptr[n]:indptr[n + 1]]].sum(0)
        for t in (cache, table):
            np.testing.assert_array_equal(np.asarray(jdirect.gather(t, every)), saved_rows)
            np.testing.assert_allclose(np.asarray(jdirect.neighbor_sum(
                t, jnp.asarray(indptr), jnp.asarray(indices))), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < jdirect.partitioned_cache.MIN_JAX,
    reason="PartitionedCache needs jax >= 0.10")
def test_a_partitioned_cache_is_refused_before_writing(tmp_path):

    with jdirect.HostTable.copy_of(np.ones((8, 2), np.float32)) as source, \
            jdirect.HostTable.copy_of(np.zeros((8, 2), np.float32)) as table:
        mesh = jax.make_mesh((1,), ("d",))
        save_tables(tmp_path / "t.npz", jdirect.PartitionedCache(source, [1, 2], mesh))
        with pytest.raises(TableCheckpointError, match="a PartitionedCache's slices on each "
                                                       "device would keep the old rows"):
            restore_tables(tmp_path / "t.npz", jdirect.PartitionedCache(table, [1, 2], mesh))
        np.testing.assert_array_equal(table.numpy(), 0)
