"""Checkpoints of host tables: round trip, bounded memory, crashes mid-save,
damaged files and mismatched restores."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from jdirect import embeddings
from jdirect.checkpoint import format as fmt
from jdirect.checkpoint.directory import DirectoryLock
from conftest import child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def trained():
    """An embedding table and a lazy Adam state after two steps, and their values."""
    table = embeddings.create_table(300, 16, seed=3)
    opt = embeddings.sparse_adam(0.1, per_row_steps=True)
    state = opt.init(table)
    current = (table, state)
    for ids in ([1, 2, 2, 299], [7, 1]):
        current = jax.jit(opt.apply)(*current, np.array(ids, np.int32),
                                     np.ones((len(ids), 16), np.float32))
    jax.block_until_ready(current)  # the writes are done before the host reads
    # The HostTables that own the memory, with the latest count.
    state = state._replace(count=current[1].count)
    values = [table.numpy().copy()] + [state.slots[k].numpy().copy() for k in sorted(state.slots)]
    yield table, state, values
    embeddings.close((table, state))


def _fresh(shape=(300, 16), dtype=np.float32, **adam):
    table = embeddings.create_table(*shape, seed=99, dtype=dtype)
    return table, embeddings.sparse_adam(0.1, per_row_steps=True, **adam).init(table)


def _values(table, state):
    return [table.numpy()] + [state.slots[k].numpy() for k in sorted(state.slots)]


def test_round_trip(tmp_path, trained):
    table, state, values = trained
    path = tmp_path / "emb.npz"
    jdirect.save_tables(path, (table, state), metadata=dict(step=2, note="x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz"]  # no temporaries, no lock

    target = _fresh()
    (t, s), meta = jdirect.restore_tables(path, target)
    assert meta == dict(step=2, note="x")
    assert t is target[0] and s.slots["mu"] is target[1].slots["mu"]  # filled in place
    for got, want in zip(_values(t, s), values):
        np.testing.assert_array_equal(got, want)
    assert isinstance(s.count, jax.Array) and int(s.count) == 2
    # Readable without jdirect: the members are .npy files.
    with np.load(path) as z:
        np.testing.assert_array_equal(z["leaf0"], values[0])
    embeddings.close(target)


def test_round_trip_bfloat16_and_numpy_leaves(tmp_path):
    with embeddings.create_table(50, 4, seed=1, dtype=jnp.bfloat16) as table, \
            embeddings.create_table(50, 4, seed=2, dtype=jnp.bfloat16) as other:
        extra = {"ids": np.arange(5, dtype=np.int64)}
        jdirect.save_tables(tmp_path / "t.npz", {"table": table, "extra": extra})
        restored, meta = jdirect.restore_tables(
            tmp_path / "t.npz", {"table": other, "extra": {"ids": np.zeros(5, np.int64)}})
        assert meta == {}
        np.testing.assert_array_equal(other.numpy(), table.numpy())
        np.testing.assert_array_equal(restored["extra"]["ids"], extra["ids"])


def test_streams_in_pieces_without_a_second_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(fmt, "CHUNK_BYTES", 1 << 20)
    with embeddings.create_table(1 << 15, 256, seed=0) as table, \
            embeddings.create_table(1 << 15, 256, seed=1) as target:  # 32 MiB each
        tracemalloc.start()
        try:
            jdirect.save_tables(tmp_path / "big.npz", table)
            _, saving = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            jdirect.restore_tables(tmp_path / "big.npz", target)
            _, restoring = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert saving < 8 << 20 and restoring < 8 << 20, (saving, restoring)
        np.testing.assert_array_equal(target.numpy(), table.numpy())


def test_an_interrupted_save_leaves_the_previous_file(tmp_path, trained, monkeypatch):
    table, state, values = trained
    path = tmp_path / "emb.npz"
    jdirect.save_tables(path, (table, state))
    before = path.read_bytes()
    table.numpy()[...] += 1  # a newer state, whose save is interrupted

    def interrupted(array):  # the first piece is written, then Ctrl-C
        yield array.reshape(-1)[:100]
        raise KeyboardInterrupt

    monkeypatch.setattr(fmt, "_pieces", interrupted)
    with pytest.raises(KeyboardInterrupt):
        jdirect.save_tables(path, (table, state))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz"]


_KILLED_SAVE = """
import hashlib, os, signal, sys, types
import numpy as np
import jdirect
from jdirect import embeddings
from jdirect.checkpoint import format as fmt

fmt.CHUNK_BYTES = 1 << 20
class Dying:  # a SHA-256 that kills the process at its fourth piece, like kill -9
    pieces = 0
    def __init__(self):
        self.h = hashlib.sha256()
    def update(self, b):
        Dying.pieces += 1
        if Dying.pieces == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        self.h.update(b)
    def hexdigest(self):
        return self.h.hexdigest()
fmt.hashlib = types.SimpleNamespace(sha256=Dying)
with embeddings.create_table(4096, 256, seed=5) as t:  # 4 MiB
    jdirect.save_tables(sys.argv[1], t)
"""


def test_a_save_killed_mid_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "emb.npz"
    with embeddings.create_table(4096, 256, seed=4) as good:
        jdirect.save_tables(path, good)
        env = child_env(JAX_PLATFORMS="cpu")
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_SAVE), str(path)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == -9, done.stderr
        leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".jdirect-tmp-")]
        assert len(leftovers) == 1 and leftovers[0].stat().st_size > 2 << 20  # died mid-write

        with embeddings.create_table(4096, 256, seed=0) as target:
            jdirect.restore_tables(path, target)
            np.testing.assert_array_equal(target.numpy(), good.numpy())
        # The next save removes the dead writer's leftover.
        jdirect.save_tables(path, good)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz"]


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_damaged_file_is_refused(tmp_path, damage):
    path = tmp_path / "emb.npz"
    with embeddings.create_table(100, 8, seed=1) as table:
        jdirect.save_tables(path, table)
        raw = bytearray(path.read_bytes())
        if damage == "flip":
            raw[1000] ^= 1  # inside leaf0's rows
        else:
            raw = raw[: len(raw) // 2]
        path.write_bytes(bytes(raw))
        with pytest.raises(jdirect.TableCheckpointError, match="damaged"):
            jdirect.restore_tables(path, table)


@pytest.mark.parametrize("target, match", [
    (lambda: _fresh(shape=(301, 16)),
     r"\[0\]: saved \(\(300, 16\), 'float32'\), now \(\(301, 16\)"),
    (lambda: _fresh(dtype=jnp.bfloat16), r"\[0\]: saved .*'float32'\), now .*'bfloat16'"),
    (lambda: (embeddings.create_table(300, 16),) * 1, "5 saved leaves, 1 in the target"),
])
def test_a_mismatched_restore_is_refused_before_writing(tmp_path, trained, target, match):
    table, state, _ = trained
    jdirect.save_tables(tmp_path / "emb.npz", (table, state))
    target = target()
    before = [x.copy() for x in (target[0].numpy(),)]
    with pytest.raises(jdirect.TableCheckpointError, match=match):
        jdirect.restore_tables(tmp_path / "emb.npz", target)
    np.testing.assert_array_equal(target[0].numpy(), before[0])
    embeddings.close(target)


def test_restore_refuses_a_missing_file(tmp_path, trained):
    with pytest.raises(jdirect.TableCheckpointError, match="no table checkpoint"):
        jdirect.restore_tables(tmp_path / "absent.npz", trained[0])


def test_a_version_returned_by_jit_saves_its_table(tmp_path):
    with jdirect.HostTable(np.arange(8, dtype=np.float32).reshape(4, 2)) as table:
        version = jax.jit(lambda t: t)(table)
        jdirect.save_tables(tmp_path / "v.npz", version)
        with jdirect.HostTable(np.zeros((4, 2), np.float32)) as target:
            jdirect.restore_tables(tmp_path / "v.npz", target)
            np.testing.assert_array_equal(target.numpy(), table.numpy())


def test_save_refuses_a_directory_another_writer_holds(tmp_path, trained):
    lock = DirectoryLock(tmp_path)
    try:
        with pytest.raises(jdirect.TableCheckpointError, match="in use by another run"):
            jdirect.save_tables(tmp_path / "emb.npz", trained[0])
    finally:
        lock.release()
    assert not (tmp_path / "emb.npz").exists()
