"""Checkpoints: verified saves, fallback past damaged steps, clear errors, kill -9 safety."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jdirect.graph.checkpoint import CheckpointError, Checkpoints

CONFIG = dict(seed=0, hidden=16, fanouts=[4, 3])


def state(value: float) -> dict:
    return dict(w=jnp.full((64, 32), value, jnp.float32), b=jnp.full((7,), value, jnp.bfloat16),
                step=jnp.asarray(int(value), jnp.int32),
                key=jax.random.fold_in(jax.random.key(0), int(value)))


def assert_same(a, b) -> None:
    a, b = (jax.tree.map(lambda x: jax.random.key_data(x) if jnp.issubdtype(
        x.dtype, jax.dtypes.prng_key) else x, t) for t in (a, b))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def saved(directory: Path, epochs=(0, 1, 2), **kw) -> Checkpoints:
    ckpt = Checkpoints(directory, CONFIG, keep=3, **kw)
    for e in epochs:
        ckpt.save(e, state(e), [dict(epoch=i) for i in range(e + 1)])
    return ckpt


def test_round_trip_keeps_dtypes_keys_and_history(tmp_path):
    ckpt = saved(tmp_path)
    assert ckpt.epochs() == [0, 1, 2]
    restored, meta = ckpt.restore_latest(state(0))
    assert_same(restored, state(2))
    assert meta["epoch"] == 2 and meta["history"] == [dict(epoch=i) for i in range(3)]
    assert Checkpoints(tmp_path / "empty", CONFIG).restore_latest(state(0)) is None


def test_nnx_model_and_optimizer_round_trip(tmp_path):
    def make(seed):
        model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(seed)),
                               nnx.Dropout(0.5, rngs=nnx.Rngs(seed)))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    a, b = make(0), make(1)
    Checkpoints(tmp_path, CONFIG).save(0, nnx.state(a), [])
    restored, _ = Checkpoints(tmp_path, CONFIG).restore_latest(nnx.state(b))
    nnx.update(b, restored)
    assert_same(nnx.state(a), nnx.state(b))


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def newest(directory: Path) -> Path:
    return sorted(directory.glob("epoch-*.npz"))[-1]


@pytest.mark.parametrize("damage", ["flip_data", "flip_header", "truncate", "empty"])
def test_damaged_newest_step_falls_back_with_a_warning(tmp_path, damage):
    ckpt = saved(tmp_path)
    path = newest(tmp_path)
    size = path.stat().st_size
    if damage == "flip_data":  # inside the largest leaf, as a bad disk sector would
        flip_byte(path, size // 3)
    elif damage == "flip_header":  # the JSON header: epoch, config, leaf checksums
        flip_byte(path, path.read_bytes().index(b'"leaves"'))
    else:
        with open(path, "r+b") as f:
            f.truncate(size // 2 if damage == "truncate" else 0)
    with pytest.warns(RuntimeWarning, match=path.name):
        restored, meta = ckpt.restore_latest(state(0))
    assert meta["epoch"] == 1
    assert_same(restored, state(1))


def test_no_intact_step_names_the_directory(tmp_path):
    ckpt = saved(tmp_path, epochs=(0, 1))
    for path in tmp_path.glob("epoch-*.npz"):
        flip_byte(path, path.stat().st_size // 3)
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError,
                                                     match=f"no intact checkpoint in {tmp_path}"):
        ckpt.restore_latest(state(0))


def test_non_finite_state_is_not_saved_and_not_restored(tmp_path):
    ckpt = saved(tmp_path, epochs=(0,))
    bad = state(1)
    bad["w"] = bad["w"].at[3, 4].set(jnp.nan)
    with pytest.raises(ValueError, match=r"\['w'\] has 1 non-finite"):
        ckpt.save(1, bad, [])
    assert ckpt.epochs() == [0]
    assert not list(tmp_path.glob(".tmp-*"))


def test_other_run_config_is_one_clear_error(tmp_path):
    saved(tmp_path, epochs=(0,))
    other = Checkpoints(tmp_path, dict(CONFIG, seed=1, hidden=32))
    with pytest.raises(CheckpointError, match="hidden: saved 16, now 32; seed: saved 0, now 1"):
        other.restore_latest(state(0))


def test_other_state_shape_is_one_clear_error(tmp_path):
    ckpt = saved(tmp_path, epochs=(0,))
    target = dict(state(0), w=jnp.zeros((64, 16)))
    with pytest.raises(CheckpointError, match=r"\['w'\]: saved \(\(64, 32\), 'float32'\), now "
                                              r"\(\(64, 16\), 'float32'\)"):
        ckpt.restore_latest(target)


def test_rotation_keeps_the_newest_and_drops_an_abandoned_continuation(tmp_path):
    ckpt = Checkpoints(tmp_path, CONFIG, keep=2)
    for e in range(4):
        ckpt.save(e, state(e), [])
    assert ckpt.epochs() == [2, 3]
    flip_byte(newest(tmp_path), newest(tmp_path).stat().st_size // 3)
    with pytest.warns(RuntimeWarning):
        _, meta = ckpt.restore_latest(state(0))
    assert meta["epoch"] == 2
    ckpt.save(3, state(3), [])  # retrains epoch 3 from 2: the damaged 3 is replaced
    assert ckpt.epochs() == [2, 3]
    ckpt.save(1, state(1), [])  # a later step than the one saved is never resumed over it
    assert ckpt.epochs() == [1]


def test_failed_save_leaves_older_steps_and_no_partial_file(tmp_path, monkeypatch):
    ckpt = saved(tmp_path, epochs=(0,))

    def disk_full(file, **arrays):
        file.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    with pytest.raises(CheckpointError, match="No space left.*older checkpoints are untouched"):
        ckpt.save(1, state(1), [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-00000000.npz"]


def test_save_that_does_not_read_back_is_not_committed(tmp_path, monkeypatch):
    ckpt = saved(tmp_path, epochs=(0,))
    real = np.savez

    def corrupting(file, **arrays):
        arrays["leaf0"] = arrays["leaf0"].copy()
        arrays["leaf0"][0] ^= 1  # what reaches the disk differs from the state
        real(file, **arrays)

    monkeypatch.setattr(np, "savez", corrupting)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.save(1, state(1), [])
    assert ckpt.epochs() == [0]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory the current user cannot write (root: the immutable attribute)."""
    d = tmp_path / "ro"
    saved(d, epochs=(0, 1)).close()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(d)],
                                                          capture_output=True).returncode:
        pytest.skip("running as root without chattr +i: cannot make a read-only directory")
    try:
        yield d
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)


def test_read_only_directory_is_refused_up_front_or_resumed_read_only(read_only_dir):
    with pytest.raises(CheckpointError, match=f"cannot write checkpoints to {read_only_dir}.*"
                                              "read_only=True"):
        Checkpoints(read_only_dir, CONFIG)
    ckpt = Checkpoints(read_only_dir, CONFIG, read_only=True)
    restored, meta = ckpt.restore_latest(state(0))
    assert meta["epoch"] == 1
    assert_same(restored, state(1))
    with pytest.raises(CheckpointError, match="read_only"):
        ckpt.save(2, state(2), [])


def test_uncreatable_or_missing_directory(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="cannot write checkpoints to .*file/ckpt"):
        Checkpoints(tmp_path / "file" / "ckpt", CONFIG)
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoints(tmp_path / "missing", CONFIG, read_only=True)


_SAVER = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from jdirect.graph.checkpoint import Checkpoints

    ckpt = Checkpoints(sys.argv[1], {"seed": 0})
    for epoch in range(10**6):
        ckpt.save(epoch, {"w": jnp.full((512, 1024), epoch, jnp.float32)}, [{"epoch": epoch}])
        print(epoch, flush=True)
""")


@pytest.mark.parametrize("trial", range(3))
def test_kill_9_during_saves_resumes_a_verified_step(tmp_path, trial):
    # 2 MB steps written back to back: the kill lands inside a save most of the time.
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path)], cwd=root,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(root), JAX_PLATFORMS="cpu"))
    confirmed = -1
    for _ in range(2 + 3 * trial):
        confirmed = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    restored, meta = Checkpoints(tmp_path, {"seed": 0}).restore_latest(
        {"w": jnp.zeros((512, 1024), jnp.float32)})
    assert meta["epoch"] >= confirmed
    np.testing.assert_array_equal(np.asarray(restored["w"]), meta["epoch"])
    assert meta["history"] == [{"epoch": meta["epoch"]}]
    assert not list(tmp_path.glob(".tmp-*"))  # cleaned when the directory is opened again
