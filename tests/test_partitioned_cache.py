"""PartitionedCache against jnp.take and against a NumPy count of where
each row is served from, on every device this process has; with one
device (the usual CPU run) the module runs again on 4 virtual CPU devices,
where rows really travel between devices (a mesh of two: the two-process
test below)."""

from __future__ import annotations

import sys

import jax

if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    # A process of the two-process test: before anything starts JAX's backend.
    jax.distributed.initialize(sys.argv[3], 2, int(sys.argv[2]))
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jdirect
from conftest import ON_GPU, run_tests_on_cpu_devices
from test_distributed import _env, _free_port, _run_all
from test_gather import MODES, assert_same, indices

DEVICES = jax.device_count()
pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < jdirect.partitioned_cache.MIN_JAX,
    reason="PartitionedCache needs jax >= 0.10")
ROWS, WIDTH = 300, 5


@pytest.mark.skipif(DEVICES > 1 or ON_GPU, reason="several devices: the tests run here")
def test_on_four_virtual_cpu_devices():
    # Four devices and not also two (a second run of the module, a minute
    # of CI): four exchange rows with several peers and split the 2-D
    # mesh's cache over an axis of two while copying it along the other,
    # where two split over an axis of one; the two-process test below
    # exchanges rows between two devices.
    run = run_tests_on_cpu_devices(__file__, 4)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" in run.stdout, run.stdout[-1000:]


@pytest.mark.skipif(DEVICES > 1, reason="runs from the one-device process")
def test_two_processes_exchange_rows_through_a_cross_process_collective():
    """Two processes of one CPU device each (jax.distributed, gloo): the
    all_to_all crosses processes; each process checks its own rows."""
    port = _free_port()
    _run_all([([sys.executable, __file__, "worker", str(i), f"localhost:{port}"], _env())
              for i in range(2)])


def worker(process_id: int) -> None:
    """One of the two processes of the test above (jax.distributed is
    initialised on import)."""
    mesh = jax.make_mesh((2,), ("d",))
    rng = np.random.default_rng(0)
    host = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    ids = indices(rng, ROWS, (2 * 64,), np.int32)
    idx = jax.make_array_from_callback(ids.shape, NamedSharding(mesh, P("d")), lambda s: ids[s])
    with jdirect.HostTable.copy_of(host) as table:
        cache = jdirect.PartitionedCache.from_counts(table, zipf_counts(rng), budget(40), mesh)
        per_device = jax.jit(jax.shard_map(jdirect.gather, mesh=mesh,
                                           in_specs=(cache.spec, P("d")), out_specs=P("d")))
        expected = jnp.take(host, ids, axis=0)
        (rows,) = per_device(cache, idx).addressable_shards
        assert_same(rows.data, expected[rows.index])
        (counts,) = cache.source_counts(idx).addressable_shards
        np.testing.assert_array_equal(
            counts.data, expected_sources(cache, ids, None, None)[process_id:process_id + 1])
        assert counts.data[0, 1] > 0  # rows came from the other process


@pytest.fixture(scope="module")
def mesh():
    if DEVICES == 1 and not ON_GPU:
        # A mesh of one CPU device exchanges nothing: these tests run on 4
        # virtual devices (the test at the top), not twice (100 s of CI).
        pytest.skip("runs on 4 virtual CPU devices (test_on_four_virtual_cpu_devices)")
    return jax.make_mesh((DEVICES,), ("d",))


@pytest.fixture(scope="module")
def host():
    return np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)


@pytest.fixture(scope="module")
def table(host):
    with jdirect.HostTable.copy_of(host) as t:
        yield t


def zipf_counts(rng: np.random.Generator) -> np.ndarray:
    """Access counts of a power law over a random permutation of the rows."""
    return rng.permutation(1.0 / np.arange(1, ROWS + 1) ** 1.1)


def zipf_batch(rng: np.random.Generator, counts: np.ndarray, size: int) -> np.ndarray:
    return rng.choice(ROWS, size=size, p=counts / counts.sum()).astype(np.int32)


def budget(rows_per_device: int) -> int:
    return rows_per_device * (WIDTH * 4 + 4)


def split(mesh, idx) -> jax.Array:
    return jax.device_put(jnp.asarray(idx), NamedSharding(mesh, P("d")))


# Every way of calling the gather, in "fill" mode with and without a fill
# value: the modes differ only in how an index is resolved to its row
# (`_plan`), which test_source_counts_match_numpy checks in every mode and
# test_int8_table_fallback gathers in every mode (8 programs a mode, 16 s
# of CI for clip and wrap).
@pytest.mark.parametrize("mode", [None, "fill"])
def test_gather_matches_jnp_take(mesh, host, table, mode):
    rng = np.random.default_rng(1)
    cache = jdirect.PartitionedCache.from_counts(table, zipf_counts(rng), budget(16), mesh)
    assert sum(r.size for r in cache.cached_rows) == 16 * DEVICES
    fill = {} if mode in (None, "clip", "wrap") else {"fill_value": -3.5}
    ref_of = lambda i: jnp.take(jnp.asarray(host), np.asarray(i), axis=0, mode=mode, **fill)
    idx = indices(rng, ROWS, (3, 41), np.int32)  # 123: not a multiple of the devices
    assert_same(jdirect.gather(cache, idx, mode=mode, **fill), ref_of(idx))
    gather = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, **fill))
    flat = split(mesh, indices(rng, ROWS, (24 * DEVICES,), np.int32))
    assert_same(gather(cache, flat), ref_of(flat))
    assert_same(gather(cache, jnp.asarray(idx)), ref_of(idx))
    per_device = jax.jit(jax.shard_map(lambda t, i: jdirect.gather(t, i, mode=mode, **fill),
                                       mesh=mesh, in_specs=(cache.spec, P("d")),
                                       out_specs=P("d")))
    out = per_device(cache, flat)
    assert out.sharding.device_set == set(mesh.devices.flat)
    assert_same(out, ref_of(flat))


def test_on_a_mesh_of_automatic_axes(host, table):
    """The trainer's mesh (jax.sharding.Mesh: automatic axes), 2-D with the
    cache split over one axis and copied along the other."""
    devices = np.array(jax.devices()).reshape(-1, 2) if DEVICES % 2 == 0 else None
    meshes = [jax.sharding.Mesh(np.array(jax.devices()), ("d",))]
    if devices is not None:
        meshes.append(jax.sharding.Mesh(devices, ("d", "copy")))
    rng = np.random.default_rng(5)
    for mesh in meshes:
        cache = jdirect.PartitionedCache(table, rng.permutation(ROWS)[:40], mesh, "d")
        idx = indices(rng, ROWS, (16 * DEVICES,), np.int32)
        ref = jnp.take(host, idx, axis=0)
        assert_same(jax.jit(jdirect.gather)(cache, split(mesh, idx)), ref)
        per_device = jax.jit(jax.shard_map(jdirect.gather, mesh=mesh,
                                           in_specs=(cache.spec, P("d")), out_specs=P("d")))
        assert_same(per_device(cache, split(mesh, idx)), ref)


def test_duplicates_and_zipf_batches_overflowing_a_small_capacity(mesh, host, table):
    rng = np.random.default_rng(2)
    counts = zipf_counts(rng)
    cache = jdirect.PartitionedCache.from_counts(table, counts, budget(20), mesh,
                                                 peer_capacity=0.05)
    batch = np.concatenate([zipf_batch(rng, counts, 200 * DEVICES),
                            np.full(8 * DEVICES, np.argmax(counts), np.int32)])
    idx = split(mesh, rng.permutation(batch))
    assert_same(jax.jit(jdirect.gather)(cache, idx), jnp.take(host, np.asarray(idx), axis=0))
    sources = np.asarray(cache.source_counts(idx))
    if DEVICES > 1:
        assert sources[:, 1].min() > 0  # some rows came from peers ...
        assert sources[:, 2].sum() > expected_sources(cache, idx, None, None, 1e9)[:, 2].sum()


def test_int8_table_fallback(mesh, host):
    rng = np.random.default_rng(3)
    decoded = jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(host)))
    with jdirect.Int8Table(host) as int8:
        cache = jdirect.PartitionedCache.from_counts(int8, zipf_counts(rng), budget(12), mesh)
        assert cache.dtype == np.float32 and cache.shape == host.shape
        for mode in MODES:
            idx = split(mesh, indices(rng, ROWS, (30 * DEVICES,), np.int32))
            assert_same(jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode))(cache, idx),
                        jnp.take(decoded, np.asarray(idx), axis=0, mode=mode))
        idx = split(mesh, indices(rng, ROWS, (30 * DEVICES,), np.int32))
        assert_same(jax.jit(lambda t, i: jdirect.gather(t, i, fill_value=7.0))(cache, idx),
                    jnp.take(decoded, np.asarray(idx), axis=0, fill_value=7.0))


def test_empty_batches_and_an_empty_cache(mesh, host, table):
    cache = jdirect.PartitionedCache(table, [5, 6, 7], mesh)
    for shape in [(0,), (2, 0)]:
        out = jdirect.gather(cache, np.zeros(shape, np.int32))
        assert out.shape == shape + (WIDTH,) and out.dtype == np.float32
    assert np.asarray(cache.source_counts(np.zeros(0, np.int32))).sum() == 0
    none = jdirect.PartitionedCache.from_counts(table, np.ones(ROWS), 0, mesh)
    idx = np.arange(-ROWS, ROWS, 7, dtype=np.int32)
    assert_same(jax.jit(jdirect.gather)(none, idx), jnp.take(host, idx, axis=0))


def expected_sources(cache, idx, valid, mode, peer_capacity=None) -> np.ndarray:
    """NumPy: per device (a contiguous block of the flat indices, padded to
    a multiple of the devices), the indices served by its slice, its peers
    (the first `capacity` asks of each peer) and host memory."""
    ndev = cache.devices
    flat = np.asarray(idx).reshape(-1).astype(np.int64)
    ok = np.ones(flat.size, bool) if valid is None else np.asarray(valid).reshape(-1)
    pad = -flat.size % ndev
    flat, ok = np.pad(flat, (0, pad)), np.pad(ok, (0, pad))
    if mode == "clip":
        rows = np.clip(flat, 0, ROWS - 1)
    elif mode == "wrap":
        rows = flat % ROWS
    else:
        ok &= (flat >= -ROWS) & (flat < ROWS)
        rows = np.where(flat < 0, flat + ROWS, flat)
    owner = np.full(ROWS, -1)
    for d, ids in enumerate(cache.cached_rows):
        owner[ids] = d
    m = flat.size // ndev
    cap = cache.capacity(m) if peer_capacity is None else peer_capacity
    out = np.zeros((ndev, 3), np.int64)
    for d in range(ndev):
        asks = np.zeros(ndev, np.int64)
        for r, good in zip(rows[d * m:(d + 1) * m], ok[d * m:(d + 1) * m]):
            if not good:
                continue
            o = owner[r]
            if o == d:
                out[d, 0] += 1
            elif o >= 0 and asks[o] < cap:
                asks[o] += 1
                out[d, 1] += 1
            else:
                out[d, 2] += 1
    return out


@pytest.mark.parametrize("mode", MODES)
def test_source_counts_match_numpy(mesh, table, mode):
    rng = np.random.default_rng(4)
    counts = zipf_counts(rng)
    cache = jdirect.PartitionedCache.from_counts(table, counts, budget(10), mesh,
                                                 peer_capacity=0.3)
    idx = np.where(rng.random(61 * DEVICES) < 0.2, indices(rng, ROWS, (61 * DEVICES,), np.int32),
                   zipf_batch(rng, counts, 61 * DEVICES))
    valid = rng.random(idx.shape) < 0.9
    got = np.asarray(cache.source_counts(split(mesh, idx), mode=mode, valid=split(mesh, valid)))
    np.testing.assert_array_equal(got, expected_sources(cache, idx, valid, mode))
    odd = idx[:-1].reshape(1, -1)  # padded: the pad counts nowhere
    np.testing.assert_array_equal(jax.jit(lambda t, i: t.source_counts(i, mode=mode))(cache, odd),
                                  expected_sources(cache, odd, None, mode))
    per_device = jax.jit(jax.shard_map(lambda t, i: t.source_counts(i, mode=mode)[None],
                                       mesh=mesh, in_specs=(cache.spec, P("d")),
                                       out_specs=P("d")))
    np.testing.assert_array_equal(per_device(cache, split(mesh, idx)),
                                  expected_sources(cache, idx, None, mode))


def test_rows_are_dealt_hottest_first_and_the_table_is_a_pytree(mesh, table):
    counts = np.arange(ROWS, dtype=np.int64)  # row ROWS - 1 is the hottest
    cache = jdirect.PartitionedCache.from_counts(table, counts, budget(3), mesh)
    hottest = np.arange(ROWS - 1, ROWS - 1 - 3 * DEVICES, -1)
    for d in range(DEVICES):
        np.testing.assert_array_equal(cache.cached_rows[d], hottest[d::DEVICES])
    leaves = jax.tree.leaves(cache)
    assert {x.sharding.device_set == set(mesh.devices.flat) for x in leaves} == {True}
    view = jax.tree.unflatten(jax.tree.structure(cache), leaves)
    # Jitted (as elsewhere here but test_gather_matches_jnp_take, which also
    # gathers eagerly: op by op, seconds a call): the view passes through
    # jit's flattening as a pytree argument.
    assert_same(jax.jit(jdirect.gather)(view, np.arange(ROWS, dtype=np.int32)), table.numpy())
    assert "3 rows on each of" in repr(cache)


def test_bad_arguments_and_closing(mesh, table):
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        jdirect.PartitionedCache(table, [1], jax.devices())
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        jdirect.PartitionedCache(table, [1], mesh, "x")
    with pytest.raises(ValueError, match="peer_capacity must be > 0"):
        jdirect.PartitionedCache(table, [1], mesh, peer_capacity=0)
    with pytest.raises(TypeError, match="PartitionedCache caches a HostTable"):
        jdirect.PartitionedCache(np.zeros((3, 2)), [1], mesh)
    with pytest.raises(ValueError, match="distinct"):
        jdirect.PartitionedCache(table, [1, 1], mesh)
    with pytest.raises(ValueError, match="counts needs 300 entries"):
        jdirect.PartitionedCache.from_counts(table, np.ones(3), 100, mesh)
    cache = jdirect.PartitionedCache(table, [1, 2], mesh)
    with pytest.raises(ValueError, match="valid must be a bool array"):
        cache.source_counts(np.zeros(4, np.int32), valid=np.ones(3, bool))
    # On a mesh of automatic axes, shard_map gathers a cache passed whole
    # (every slice on every device): refused.
    auto = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    whole = jax.jit(jax.shard_map(jdirect.gather, mesh=auto, in_specs=(P(), P("d")),
                                  out_specs=P("d")))
    if DEVICES > 1:
        with pytest.raises(ValueError, match="in_specs=table.spec"):
            whole(jdirect.PartitionedCache(table, [1, 2], auto),
                  split(auto, np.zeros(2 * DEVICES, np.int32)))
    with cache:
        assert not cache.closed
    assert cache.closed and "closed" in repr(cache)
    with pytest.raises(ValueError, match="PartitionedCache is closed"):
        jdirect.gather(cache, [1])
    assert isinstance(cache, jdirect.Table)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: test_partitioned_cache.py worker PROCESS_ID COORDINATOR")
    worker(int(sys.argv[2]))
