"""Checkpoints: verified saves, fallback past damaged steps, clear errors, kill -9 safety,
one writing run per directory, nothing deleted that a run did not create, resume settings."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from conftest import child_env
from jdirect.checkpoint import CheckpointError, Checkpoints, check_checkpoint_dir
from jdirect.checkpoint import format as fmt
from jdirect.graph.io.checkpoint import RESUME_KEYS, resume_settings

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


@pytest.mark.parametrize("leaf, value", [("w", jnp.nan), ("w", -jnp.inf), ("b", jnp.nan)])
def test_diverged_state_is_refused_and_the_last_good_checkpoint_resumes(tmp_path, leaf, value):
    ckpt = saved(tmp_path, epochs=(0,))
    bad = state(1)
    bad[leaf] = bad[leaf].ravel().at[3].set(value).reshape(bad[leaf].shape)  # b: bfloat16
    with pytest.raises(CheckpointError, match=rf"\['{leaf}'\] has 1 non-finite values \(training "
                                              r"diverged\); epoch 1 is not saved"):
        ckpt.save(1, bad, [])
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-00000000.npz"]
    restored, meta = Checkpoints(tmp_path, CONFIG).restore_latest(state(0))
    assert meta["epoch"] == 0
    assert_same(restored, state(0))


def test_other_run_config_is_one_clear_error(tmp_path):
    saved(tmp_path, epochs=(0,))
    other = Checkpoints(tmp_path, dict(CONFIG, seed=1, hidden=32))
    with pytest.raises(CheckpointError, match="hidden: saved 16, now 32; seed: saved 0, now 1"
                                              r"\): run with the saved settings") as e:
        other.restore_latest(state(0))
    assert "delete" not in str(e.value)


def test_save_never_deletes_steps_of_another_run(tmp_path):
    saved(tmp_path, epochs=(0, 1)).close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other = Checkpoints(tmp_path, dict(CONFIG, seed=1), keep=1)  # without restoring first
    with pytest.raises(CheckpointError, match="seed: saved 0, now 1"):
        other.save(0, state(0), [])
    other.close()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def run_settings(**changes) -> dict:
    return {**dict.fromkeys(RESUME_KEYS), "fanouts": (4, 3), "sampler": "cpu", "epochs": 3,
            **changes}


def test_resume_settings_treat_one_data_dir_written_three_ways_as_one(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    ways = ["data", "./data/", f"{tmp_path}/data/", str(tmp_path / "data")]
    settings = [resume_settings(run_settings(data_dir=d)) for d in ways]
    assert all(s == settings[0] for s in settings)
    assert settings[0]["data_dir"] == str(tmp_path.resolve() / "data")
    assert "epochs" not in settings[0] and settings[0]["fanouts"] == [4, 3]
    # The settings saved by a run given a relative path resume under the absolute one.
    ckpt = Checkpoints(tmp_path / "c2", dict(CONFIG, data_dir="data"))
    ckpt.save(0, state(0), [])
    ckpt.close()
    _, meta = Checkpoints(tmp_path / "c2", dict(CONFIG, data_dir=f"{tmp_path}/data/")
                          ).restore_latest(state(0))
    assert meta["epoch"] == 0


# devices, row_encoding and features: regression, they were accepted
# silently, and the resumed run equalled neither.
@pytest.mark.parametrize("key, old, new", [
    ("eval_max", None, 1000), ("sampler", "cpu", "device"), ("devices", 1, 2),
    ("row_encoding", "auto", "int8"), ("features", "jdirect", "host"),
    # The papers' settings and the task: regression, they resumed silently.
    ("l2", 0.0, 5e-4), ("gcn_norm", "mean", "symmetric"), ("batch", "sampled", "full"),
    ("task", "node", "link"), ("negatives", 1, 4)])
def test_resume_under_another_devices_count_or_row_encoding_is_refused(tmp_path, key, old, new):
    ckpt = Checkpoints(tmp_path, resume_settings(run_settings(**{key: old})))
    ckpt.save(0, state(0), [])
    ckpt.close()
    other = Checkpoints(tmp_path, resume_settings(run_settings(**{key: new})))
    with pytest.raises(CheckpointError, match=f"{key}: saved {old!r}, now {new!r}\\)"):
        other.restore_latest(state(0))


def test_resume_settings_name_what_is_missing():
    with pytest.raises(ValueError, match="run settings lack eval_max, sampler"):
        resume_settings({k: None for k in RESUME_KEYS if k not in ("eval_max", "sampler")})


def test_checkpoint_dir_naming_a_file_says_it_is_a_file(tmp_path):
    # Regression: "(File exists)", with advice to pass --checkpoint-read-only.
    (tmp_path / "file").write_text("mine")
    for read_only in (False, True):
        with pytest.raises(CheckpointError, match=f"^checkpoint directory {tmp_path}/file is a "
                                                  "file, not a directory$"):
            check_checkpoint_dir(tmp_path / "file", read_only=read_only)
    assert (tmp_path / "file").read_text() == "mine"


def test_checkpoints_honour_the_umask(tmp_path):
    # Regression: every step was created mode 0600 (mkstemp's), whatever the umask.
    for umask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        old = os.umask(umask)
        try:
            ckpt = Checkpoints(tmp_path / f"u{umask:o}", CONFIG)
            ckpt.save(0, state(0), [])
            ckpt.close()
        finally:
            os.umask(old)
        step = tmp_path / f"u{umask:o}" / "epoch-00000000.npz"
        assert step.stat().st_mode & 0o777 == mode


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

    def disk_full(file, *args, **kwargs):
        file.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fmt, "write", disk_full)
    with pytest.raises(CheckpointError, match="No space left.*older checkpoints are untouched"):
        ckpt.save(1, state(1), [])
    ckpt.close()  # and with it the lock file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-00000000.npz"]


def test_save_that_does_not_read_back_is_not_committed(tmp_path, monkeypatch):
    ckpt = saved(tmp_path, epochs=(0,))
    real = fmt.write

    class Corrupting:  # what reaches the disk differs from the state
        def __init__(self, file):
            self.file, self.done = file, False

        def write(self, data):
            if not self.done and len(data) >= 1024:  # leaf data
                data, self.done = bytes([data[0] ^ 1]) + bytes(data[1:]), True
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    monkeypatch.setattr(fmt, "write", lambda file, *a, **k: real(Corrupting(file), *a, **k))
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
    # Before any work, in the words of a CLI that names its own flag.
    with pytest.raises(CheckpointError, match=f"cannot write checkpoints to {read_only_dir} .*"
                                              "pass --checkpoint-read-only to resume") as e:
        check_checkpoint_dir(read_only_dir, read_only_option="--checkpoint-read-only")
    assert "read_only=True" not in str(e.value)
    assert check_checkpoint_dir(read_only_dir, read_only=True) == read_only_dir
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
    with pytest.raises(CheckpointError, match=f"cannot make checkpoint directory .*file/ckpt: "
                                              f"{tmp_path}/file is a file, not a directory$"):
        Checkpoints(tmp_path / "file" / "ckpt", CONFIG)
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoints(tmp_path / "missing", CONFIG, read_only=True)
    with pytest.raises(CheckpointError, match="missing does not exist; --checkpoint-read-only "
                                              "only resumes"):
        check_checkpoint_dir(tmp_path / "missing", read_only=True,
                             read_only_option="--checkpoint-read-only")


def test_check_checkpoint_dir_on_a_full_disk_fails_before_any_work(tmp_path, monkeypatch):
    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(CheckpointError, match=f"cannot write checkpoints to {tmp_path} "
                                              r"\(No space left on device\)"):
        check_checkpoint_dir(tmp_path)
    assert not list(tmp_path.iterdir())  # neither the probe nor the lock file stays


def test_check_checkpoint_dir_leaves_nothing_behind(tmp_path):
    assert check_checkpoint_dir(tmp_path / "new") == tmp_path / "new"
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())


# -- one writing run per directory -------------------------------------------

def holder_pattern(pid: int) -> str:
    return (rf"is in use by another run \(pid {pid} on host {re.escape(platform.node())}, "
            r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\); wait for it to end")


def test_second_run_on_one_directory_is_refused_naming_the_holder(tmp_path):
    first = saved(tmp_path, epochs=(0,))
    in_flight = tmp_path / f".jdirect-tmp-{os.getpid()}-inflight"  # the first run's, mid-save
    in_flight.write_bytes(b"")
    with pytest.raises(CheckpointError, match=holder_pattern(os.getpid())):
        Checkpoints(tmp_path, CONFIG)
    with pytest.raises(CheckpointError, match=holder_pattern(os.getpid())):
        check_checkpoint_dir(tmp_path)  # the same, before any work
    assert in_flight.exists() and first.epochs() == [0]
    first.close()
    Checkpoints(tmp_path, CONFIG).close()  # free again once the first run ends


def test_read_only_openers_take_no_lock(tmp_path):
    # A multi-process run: process 0 writes, the others only read.
    writer = saved(tmp_path, epochs=(0,))
    reader = Checkpoints(tmp_path, CONFIG, read_only=True)
    writer.save(1, state(1), [])
    _, meta = reader.restore_latest(state(0))
    assert meta["epoch"] == 1
    writer.close()
    Checkpoints(tmp_path, CONFIG).close()  # a reader still open does not hold the directory


def test_stale_lock_file_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    lock = tmp_path / ".jdirect-lock"
    lock.write_text(json.dumps(dict(pid=int(dead.stdout), host=platform.node(), started="then")))
    ckpt = Checkpoints(tmp_path, CONFIG)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    ckpt.close()
    assert not lock.exists()


def test_file_system_without_locks_warns_and_removes_no_temporary(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    leftover = tmp_path / ".jdirect-tmp-999999999-abcd1234"  # cannot be proven stale unlocked
    leftover.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="cannot lock .*No locks available.*would not be "
                                            "refused"):
        ckpt = saved(tmp_path, epochs=(0,))
    assert ckpt.epochs() == [0] and leftover.exists()


def test_user_files_named_like_temporaries_survive(tmp_path):
    users = [".tmp-notes", ".tmp-abc123", ".jdirect-tmp-notes", ".jdirect-tmp-1-abc.npy",
             f".jdirect-tmp-{os.getppid()}-abcd1234"]  # the last: a live process's
    for name in users:
        (tmp_path / name).write_text("mine")
    saved(tmp_path, epochs=(0, 1, 2, 3)).close()
    assert all((tmp_path / name).read_text() == "mine" for name in users)


def test_temporaries_are_named_after_the_run(tmp_path, monkeypatch):
    names = []
    real = fmt.write

    def recording(file, *args, **kwargs):
        names.extend(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(fmt, "write", recording)
    saved(tmp_path, epochs=(0,)).close()
    assert len(names) == 2 and ".jdirect-lock" in names  # the lock and the step being written
    names.remove(".jdirect-lock")
    assert re.fullmatch(rf"\.jdirect-tmp-{os.getpid()}-\w+", names[0])


_HOLDER = textwrap.dedent("""
    import sys, time
    from jdirect.checkpoint import Checkpoints

    ckpt = Checkpoints(sys.argv[1], {"seed": 0})
    print("locked", flush=True)
    time.sleep(600)
""")


def python(script: str, *args: str) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=root,
                            stdout=subprocess.PIPE, text=True,
                            env=child_env(JAX_PLATFORMS="cpu"))


def test_run_in_another_process_is_refused_and_its_lock_taken_over_once_killed(tmp_path):
    proc = python(_HOLDER, str(tmp_path))
    try:
        assert proc.stdout.readline() == "locked\n"
        with pytest.raises(CheckpointError, match=holder_pattern(proc.pid)):
            Checkpoints(tmp_path, {"seed": 0})
    finally:
        proc.kill()
        proc.wait()
    leftover = tmp_path / f".jdirect-tmp-{proc.pid}-abcd1234"  # as if killed mid-save
    leftover.write_bytes(b"partial")
    Checkpoints(tmp_path, {"seed": 0}).close()
    assert not leftover.exists()  # provably stale: its writer is dead and we hold the lock


_SAVER = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from jdirect.checkpoint import Checkpoints

    ckpt = Checkpoints(sys.argv[1], {"seed": 0})
    for epoch in range(10**6):
        ckpt.save(epoch, {"w": jnp.full((512, 1024), epoch, jnp.float32)}, [{"epoch": epoch}])
        print(epoch, flush=True)
""")


@pytest.mark.parametrize("trial", range(3))
def test_kill_9_during_saves_resumes_a_verified_step(tmp_path, trial):
    # 2 MB steps written back to back: the kill lands inside a save most of the time.
    proc = python(_SAVER, str(tmp_path))
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
    assert not list(tmp_path.glob(".jdirect-tmp-*"))  # removed when the directory is opened
    # again: they were the killed run's


# -- the file format (jdirect.checkpoint.format), shared by save_tables ------

import jdirect  # noqa: E402
from jdirect.checkpoint import TableCheckpointError, restore_tables, save_tables  # noqa: E402


def mixed_tree(seed: int) -> tuple[dict, dict]:
    """(tree, its values as NumPy): host tables of several dtypes, NumPy
    leaves (strided, Fortran, 0-d), jax arrays and a PRNG key."""
    rng = np.random.default_rng(seed)
    values = dict(
        f32=rng.standard_normal((37, 5)).astype(np.float32),
        bf16=rng.standard_normal((11, 3)).astype(jnp.bfloat16),
        i8=rng.integers(-128, 127, (9, 7), dtype=np.int8),
        i64=rng.integers(0, 2**40, (6,), dtype=np.int64),
        strided=rng.standard_normal((8, 6))[:, ::2],
        fortran=np.asfortranarray(rng.standard_normal((4, 3)).astype(np.float32)),
        scalar=np.float64(seed + 0.5),
        jax=rng.standard_normal((5, 4)).astype(np.float32),
        key=np.asarray(jax.random.key_data(jax.random.key(seed))))
    tree = dict(tables=dict(f32=jdirect.HostTable.copy_of(values["f32"]),
                            bf16=jdirect.HostTable.copy_of(values["bf16"]),
                            i8=jdirect.HostTable.copy_of(values["i8"]),
                            i64=jdirect.HostTable.copy_of(values["i64"])),
                strided=values["strided"], fortran=values["fortran"], scalar=values["scalar"],
                jax=jnp.asarray(values["jax"]), key=jax.random.key(seed))
    return tree, values


def as_numpy(tree: dict) -> dict:
    tables = {k: t.numpy() for k, t in tree["tables"].items()}
    return dict(tables, **{k: np.asarray(jax.random.key_data(v) if k == "key" else v)
                           for k, v in tree.items() if k != "tables"})


def close_tables(tree: dict) -> None:
    for table in tree["tables"].values():
        table.close()


@pytest.mark.parametrize("chunk", [1 << 20, 24])  # 24 bytes: pieces cut rows apart
def test_tree_of_host_tables_and_arrays_round_trips_as_numpy_holds_it(tmp_path, monkeypatch,
                                                                       chunk):
    monkeypatch.setattr(fmt, "CHUNK_BYTES", chunk)
    tree, values = mixed_tree(1)
    target, _ = mixed_tree(2)
    tables = dict(target["tables"])
    save_tables(tmp_path / "t.npz", tree, metadata=dict(note="x"))
    restored, meta = restore_tables(tmp_path / "t.npz", target)
    assert meta == dict(note="x")
    assert all(restored["tables"][k] is tables[k] for k in tables)  # filled in place
    got = as_numpy(restored)
    for key, want in values.items():
        assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
        np.testing.assert_array_equal(got[key], want, err_msg=key)
    assert isinstance(restored["jax"], jax.Array)
    assert jnp.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)
    with np.load(tmp_path / "t.npz") as z:  # readable without jdirect
        leaf = [e["path"] for e in json.loads(z.zip.read("header.json"))["leaves"]].index(
            "['tables']['f32']")
        np.testing.assert_array_equal(z[f"leaf{leaf}"], values["f32"])
    # A run's step holds the same tree, tables streamed the same way.
    ckpt = Checkpoints(tmp_path / "run", CONFIG)
    ckpt.save(0, tree, [])
    fresh, _ = mixed_tree(3)
    restored, meta = ckpt.restore_latest(fresh)
    got = as_numpy(restored)
    for key, want in values.items():
        np.testing.assert_array_equal(got[key], want, err_msg=key)
    ckpt.close()
    for t in (tree, target, fresh):
        close_tables(t)


@pytest.mark.parametrize("chunk", [1 << 20, 40])
def test_each_leafs_sha256_is_hashlibs_of_its_bytes(tmp_path, monkeypatch, chunk):
    """The header's SHA-256 of a leaf (its pieces hashed on a worker thread
    while they are written) is hashlib's of the bytes stored, whatever the
    pieces: a hash that skipped or reordered pieces would match itself on
    the read back, not this."""
    import hashlib
    import zipfile

    monkeypatch.setattr(fmt, "CHUNK_BYTES", chunk)
    values = np.random.default_rng(3).standard_normal((5000, 7)).astype(np.float32)
    with jdirect.HostTable.copy_of(values) as table:
        save_tables(tmp_path / "t.npz", dict(t=table, a=np.arange(999.0)))
    with zipfile.ZipFile(tmp_path / "t.npz") as z:
        entries = json.loads(z.read("header.json"))["leaves"]
        for i, entry in enumerate(entries):
            with z.open(f"leaf{i}.npy") as member:
                np.lib.format.read_magic(member)
                np.lib.format.read_array_header_2_0(member)
                assert entry["sha256"] == hashlib.sha256(member.read()).hexdigest(), entry
    assert {e["path"] for e in entries} == {"['a']", "['t']"}


def test_a_run_checkpoint_streams_its_host_tables(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(fmt, "CHUNK_BYTES", 1 << 20)
    with jdirect.HostTable.copy_of(np.full((1 << 15, 256), 3, np.float32)) as table, \
            jdirect.HostTable.copy_of(np.zeros((1 << 15, 256), np.float32)) as target:
        ckpt = Checkpoints(tmp_path, CONFIG)
        tracemalloc.start()
        try:
            ckpt.save(0, dict(table=table, step=np.int32(4)), [])  # 32 MiB
            _, saving = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            ckpt.restore_latest(dict(table=target, step=np.int32(0)))
            _, restoring = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        ckpt.close()
        assert saving < 8 << 20 and restoring < 8 << 20, (saving, restoring)
        np.testing.assert_array_equal(target.numpy(), 3)


def rewrite_header(path: Path, change) -> None:
    """Rewrites the archive at `path` with its header.json changed by
    `change(header)`, every member's CRC-32 valid: only our hashes can tell."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    header = json.loads(members["header.json"])
    change(header)
    members["header.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_a_leaf_that_differs_from_its_hash_is_refused_naming_it(tmp_path):
    with jdirect.HostTable.copy_of(np.arange(40, dtype=np.float32).reshape(10, 4)) as table:
        save_tables(tmp_path / "t.npz", dict(t=table, n=np.arange(3)))
        rewrite_header(tmp_path / "t.npz",
                       lambda h: h["leaves"][1].update(sha256="0" * 64))  # ['t']
        with pytest.raises(TableCheckpointError, match=r"damaged \(checksum mismatch in "
                                                       r"\['t'\]\); tables may have been") as e:
            restore_tables(tmp_path / "t.npz", dict(t=table, n=np.zeros(3, np.int64)))
        assert "\n" not in str(e.value)
    ckpt = saved(tmp_path / "run", epochs=(0, 1))
    rewrite_header(newest(tmp_path / "run"), lambda h: h["leaves"][0].update(sha256="0" * 64))
    with pytest.warns(RuntimeWarning, match=r"epoch-00000001.npz is damaged \(checksum mismatch "
                                            r"in \['b'\]\); falling back"):
        _, meta = ckpt.restore_latest(state(0))
    assert meta["epoch"] == 0


@pytest.mark.parametrize("keep", [0, 10, 200, -1])  # bytes kept (-1: all but the last)
def test_a_truncated_file_is_refused_in_one_line_before_writing(tmp_path, keep):
    with jdirect.HostTable.copy_of(np.ones((64, 8), np.float32)) as table, \
            jdirect.HostTable.copy_of(np.zeros((64, 8), np.float32)) as target:
        save_tables(tmp_path / "t.npz", table)
        data = (tmp_path / "t.npz").read_bytes()
        (tmp_path / "t.npz").write_bytes(data[:keep] if keep >= 0 else data[:-1])
        with pytest.raises(TableCheckpointError, match=r"t.npz is damaged \(not a checkpoint, "
                                                       r"or cut short .*nothing was restored$"
                           ) as e:
            restore_tables(tmp_path / "t.npz", target)
        assert "\n" not in str(e.value)
        np.testing.assert_array_equal(target.numpy(), 0)


def test_files_of_format_1_are_refused_naming_the_format(tmp_path):
    """The two formats before jdirect.checkpoint: save_tables' (header.json
    of format 1) and the trainer's step files (a `header` member)."""
    old_tables = tmp_path / "tables.npz"
    np.savez(old_tables, leaf0=np.zeros((4, 2), np.float32))
    rewrite_header_of_format_1 = dict(format=1, metadata={}, leaves=[])
    import zipfile

    with zipfile.ZipFile(old_tables, "a") as z:
        z.writestr("header.json", json.dumps(rewrite_header_of_format_1))
    message = (r"is a checkpoint of format 1, written by an older jdirect; this one reads "
               r"format 2 only")
    with jdirect.HostTable.copy_of(np.ones((4, 2), np.float32)) as target:
        with pytest.raises(TableCheckpointError, match=f"tables.npz {message}") as e:
            restore_tables(old_tables, target)
        assert "\n" not in str(e.value)
        np.testing.assert_array_equal(target.numpy(), 1)

    run = tmp_path / "run"
    run.mkdir()
    header = json.dumps(dict(format=1, epoch=0, run_config=CONFIG, history=[], leaves=[]))
    np.savez(run / "epoch-00000000.npz", leaf0=np.zeros(3, np.uint8),
             header=np.frombuffer(header.encode(), np.uint8))
    ckpt = Checkpoints(run, CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not skipped as damaged
        with pytest.raises(CheckpointError, match=f"epoch-00000000.npz {message}.*move {run} "
                                                  "aside"):
            ckpt.restore_latest(state(0))
    with pytest.raises(CheckpointError, match=f"epoch-00000000.npz {message}"):
        ckpt.save(1, state(1), [])  # rotation would delete it
    ckpt.close()
    assert (run / "epoch-00000000.npz").exists()


def test_a_diverged_host_table_is_not_saved(tmp_path):
    table = np.ones((50, 4), np.float32)
    table[17, 2] = np.nan
    ckpt = saved(tmp_path, epochs=(0,))
    with jdirect.HostTable.copy_of(table) as bad:
        with pytest.raises(CheckpointError, match=r"\['t'\] has 1 non-finite values \(training "
                                                  r"diverged\); epoch 1 is not saved"):
            ckpt.save(1, dict(t=bad), [])
    assert ckpt.epochs() == [0] and not list(tmp_path.glob(".jdirect-tmp-*"))


def test_restore_into_a_closed_host_table_is_refused_before_writing(tmp_path):
    with jdirect.HostTable.copy_of(np.ones((6, 2), np.float32)) as table:
        ckpt = Checkpoints(tmp_path, CONFIG)
        ckpt.save(0, dict(a=table, b=table), [])
    first = jdirect.HostTable.copy_of(np.zeros((6, 2), np.float32))
    closed = jdirect.HostTable.copy_of(np.zeros((6, 2), np.float32))
    closed.close()
    with pytest.raises(CheckpointError, match=r"into \['b'\]: .* is closed; nothing was "
                                              "restored"):
        ckpt.restore_latest(dict(a=first, b=closed))
    np.testing.assert_array_equal(first.numpy(), 0)
    first.close()
    ckpt.close()
