"""The archive reader against damaged and crafted files (issue 51, items 6-8):
every failure is the package's own error in one line, never a raw
zipfile/zlib/JSON exception; only what the writer writes (stored, regular,
unencrypted members, the header's structure) is accepted; header.json is
bounded before it is read; a run's restore falls back past any of it.

A seeded fuzzer (bit flips at sampled positions and at every bit of the
members' flag and version fields, truncations) runs in a few seconds; the
crafted cases are one each."""

from __future__ import annotations

import io
import json
import stat
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from jdirect.checkpoint import (CheckpointError, Checkpoints, TableCheckpointError,
                                read_metadata, restore_tables, save_tables)
from jdirect.checkpoint import format as fmt

ROWS = np.arange(64, dtype=np.float32).reshape(16, 4)
IDS = np.arange(5, dtype=np.int64)
CONFIG = dict(seed=0)


def tables_file(tmp_path: Path) -> bytes:
    with jdirect.HostTable.copy_of(ROWS) as table:
        save_tables(tmp_path / "good.npz", dict(t=table, n=IDS), metadata=dict(note="x"))
    return (tmp_path / "good.npz").read_bytes()


def restore_outcome(path: Path) -> str:
    """'ok' (the saved values, exactly) or 'refused' (one line of the package's
    error); anything else fails the test."""
    with jdirect.HostTable.copy_of(np.zeros_like(ROWS)) as target:
        try:
            out, meta = restore_tables(path, dict(t=target, n=np.zeros(5, np.int64)))
        except TableCheckpointError as e:
            assert "\n" not in str(e) and str(path) in str(e)
            return "refused"
        np.testing.assert_array_equal(target.numpy(), ROWS)
        np.testing.assert_array_equal(out["n"], IDS)
        assert meta == dict(note="x")
        return "ok"


def metadata_outcome(path: Path) -> str:
    try:
        read_metadata(path)
    except fmt.Damaged as e:
        assert "\n" not in str(e)
        return "refused"
    return "ok"


def central_headers(data: bytes) -> dict[str, int]:
    """{member name: offset of its central directory header} of an archive."""
    out, at = {}, data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        out[data[at + 46:at + 46 + name_len].decode()] = at
        at = data.find(b"PK\x01\x02", at + 46 + name_len)
    return out


def test_fuzzed_table_files_restore_exactly_or_are_refused_in_one_line(tmp_path):
    good = tables_file(tmp_path)
    rng = np.random.default_rng(51)
    # Every bit of each member's version needed and flag fields (an encrypted
    # flag, an unknown version: raw RuntimeError/NotImplementedError before),
    # and bits sampled from the whole file.
    structure = [8 * (at + field) + bit for at in central_headers(good).values()
                 for field in range(6, 10) for bit in range(8)]
    sampled = rng.choice(8 * len(good), size=400, replace=False)
    outcomes = {"ok": 0, "refused": 0}
    path = tmp_path / "t.npz"
    for bit in [*structure, *sampled]:
        data = bytearray(good)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        outcomes[restore_outcome(path)] += 1
        metadata_outcome(path)
    for cut in rng.choice(len(good), size=40, replace=False):
        path.write_bytes(good[:cut])
        assert restore_outcome(path) == "refused"
        assert metadata_outcome(path) == "refused"
    assert outcomes["refused"] > 100 and outcomes["ok"] > 10, outcomes


def test_a_fuzzed_newest_step_falls_back_to_the_older_intact_one(tmp_path):
    # Regression: 61 of 8,480 single-bit flips raised raw errors, and
    # restore_latest died instead of falling back as documented.
    ckpt = Checkpoints(tmp_path, CONFIG, keep=3)
    for epoch in (0, 1):
        ckpt.save(epoch, dict(w=jnp.full((8, 4), epoch, jnp.float32)), [dict(epoch=epoch)])
    ckpt.close()
    newest = tmp_path / "epoch-00000001.npz"
    good = newest.read_bytes()
    reader = Checkpoints(tmp_path, CONFIG, read_only=True)
    rng = np.random.default_rng(7)
    structure = [8 * (at + field) + bit for at in central_headers(good).values()
                 for field in range(6, 10) for bit in range(8)]
    epochs = set()
    for bit in [*structure, *rng.choice(8 * len(good), size=150, replace=False)]:
        data = bytearray(good)
        data[bit // 8] ^= 1 << (bit % 8)
        newest.write_bytes(bytes(data))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored, meta = reader.restore_latest(dict(w=jnp.zeros((8, 4), jnp.float32)))
        np.testing.assert_array_equal(np.asarray(restored["w"]), meta["epoch"])
        assert (meta["epoch"] == 0) == any("falling back" in str(w.message) for w in caught)
        epochs.add(meta["epoch"])
    assert epochs == {0, 1}


# -- crafted archives ---------------------------------------------------------

def members(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info, z.read(info)) for info in z.infolist()]


def archive(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Duplicate name"
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
            for info, data in entries:
                z.writestr(info, data)
    return out.getvalue()


def with_header(data: bytes, change) -> bytes:
    """The archive with header.json's parsed JSON replaced by `change(header)`
    (raw bytes if it returns bytes), every CRC valid."""
    out = []
    for info, body in members(data):
        if info.filename == "header.json":
            new = change(json.loads(body))
            body = new if isinstance(new, bytes) else json.dumps(new).encode()
        out.append((info, body))
    return archive(out)


def with_members(data: bytes, change) -> bytes:
    return archive(change(members(data)))


def entry(header: dict, **fields) -> dict:
    header["leaves"][0].update(fields)
    return header


def without(header: dict, field: str) -> dict:
    del header["leaves"][0][field]
    return header


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(buf, np.lib.format.header_data_from_array_1_0(array))
    return buf.getvalue() + array.tobytes()


def compressed(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def typed(name: str, kind: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (kind | 0o644) << 16
    return info


def flag(data: bytes, name: str, offset: int, value: int) -> bytes:
    """The archive with a 2-byte field of `name`'s central directory header set."""
    out = bytearray(data)
    struct.pack_into("<H", out, central_headers(data)[name] + offset, value)
    return bytes(out)


CRAFTED = {
    # item 8: headers of the wrong JSON structure (raw AttributeError/TypeError/KeyError before)
    "header a list": lambda d: with_header(d, lambda h: [h]),
    "leaves not a list": lambda d: with_header(d, lambda h: dict(h, leaves={"0": h["leaves"]})),
    "entry without sha256": lambda d: with_header(d, lambda h: without(h, "sha256")),
    "entry without path": lambda d: with_header(d, lambda h: without(h, "path")),
    "entry a string": lambda d: with_header(d, lambda h: dict(h, leaves=["leaf"] * 2)),
    "negative shape": lambda d: with_header(d, lambda h: entry(h, shape=[-16, 4])),
    "object dtype": lambda d: with_header(d, lambda h: entry(h, dtype="object")),
    "unknown dtype": lambda d: with_header(d, lambda h: entry(h, dtype="float33")),
    "metadata a list": lambda d: with_header(d, lambda h: dict(h, metadata=[1])),
    "format a string": lambda d: with_header(d, lambda h: dict(h, format="2")),
    "deep nesting": lambda d: with_header(d, lambda h: b"[" * 200_000 + b"]" * 200_000),
    "not UTF-8": lambda d: with_header(d, lambda h: b'{"format": 2, "\xff": 1}'),
    "huge shape": lambda d: with_header(d, lambda h: entry(h, shape=[2**62, 2**62])),
    # item 7: only what the writer writes
    "compressed leaf": lambda d: with_members(
        d, lambda m: [((compressed(i) if i.filename == "leaf0.npy" else i), b) for i, b in m]),
    "compressed header": lambda d: with_members(
        d, lambda m: [((compressed(i) if i.filename == "header.json" else i), b) for i, b in m]),
    "directory member": lambda d: with_members(d, lambda m: m + [(typed("x/", stat.S_IFDIR), b"")]),
    "symlink leaf": lambda d: with_members(
        d, lambda m: [((typed(i.filename, stat.S_IFLNK) if i.filename == "leaf1.npy" else i), b)
                      for i, b in m]),
    "duplicate leaf": lambda d: with_members(d, lambda m: m + [m[0]]),
    "extra member": lambda d: with_members(d, lambda m: m + [("evil.npy", npy(IDS))]),
    "missing leaf": lambda d: with_members(d, lambda m: m[1:]),
    "no header": lambda d: with_members(d, lambda m: m[:-1]),
    # item 6: flag and version fields (raw RuntimeError / NotImplementedError before)
    "encrypted leaf": lambda d: flag(d, "leaf0.npy", 8, 1),
    "encrypted header": lambda d: flag(d, "header.json", 8, 1),
    "version 9.9 needed": lambda d: flag(d, "leaf0.npy", 6, 99),
    "strong encryption": lambda d: flag(d, "leaf0.npy", 8, 1 << 6),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_archive_is_refused_in_one_line_before_anything_is_written(tmp_path, case):
    path = tmp_path / "t.npz"
    path.write_bytes(CRAFTED[case](tables_file(tmp_path)))
    with pytest.raises(fmt.Damaged):
        read_metadata(path)
    with jdirect.HostTable.copy_of(np.full_like(ROWS, 7)) as target:
        with pytest.raises(TableCheckpointError, match=f"^{path} is damaged .*nothing was "
                                                       "restored$") as e:
            restore_tables(path, dict(t=target, n=np.zeros(5, np.int64)))
        assert "\n" not in str(e.value)
        np.testing.assert_array_equal(target.numpy(), 7)


@pytest.mark.parametrize("case", ["other npy shape", "data past its shape"])
def test_a_leaf_unlike_its_entry_is_refused(tmp_path, case):
    def change(m):
        body = npy(ROWS.reshape(4, 16)) if case == "other npy shape" else npy(ROWS) + b"\0" * 8
        return [(i, body if i.filename == "leaf1.npy" else b) for i, b in m]  # ['t']

    path = tmp_path / "t.npz"
    path.write_bytes(with_members(tables_file(tmp_path), change))
    with jdirect.HostTable.copy_of(np.zeros_like(ROWS)) as target:
        with pytest.raises(TableCheckpointError, match=r"damaged \(\['t'\] is unreadable"):
            restore_tables(path, dict(t=target, n=np.zeros(5, np.int64)))


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_newest_step_falls_back(tmp_path, case):
    ckpt = Checkpoints(tmp_path, CONFIG, keep=3)
    for epoch in (0, 1):
        ckpt.save(epoch, dict(w=jnp.full((8, 4), epoch, jnp.float32), n=np.arange(3)), [])
    newest = tmp_path / "epoch-00000001.npz"
    newest.write_bytes(CRAFTED[case](newest.read_bytes()))
    with pytest.warns(RuntimeWarning, match="epoch-00000001.npz is damaged"):
        _, meta = ckpt.restore_latest(dict(w=jnp.zeros((8, 4), jnp.float32), n=np.zeros(3, int)))
    assert meta["epoch"] == 0
    ckpt.close()


def test_header_json_is_bounded_before_it_is_read(tmp_path):
    # Regression: a 0.3 MB file made read_metadata allocate about 600 MB (a
    # deflated header.json, read whole).
    good = tables_file(tmp_path)
    bomb = tmp_path / "bomb.npz"
    padded = lambda h: json.dumps(h).encode() + b" " * (64 << 20)  # noqa: E731
    bomb.write_bytes(with_members(with_header(good, padded), lambda m: [
        ((compressed(i) if i.filename == "header.json" else i), b) for i, b in m]))
    assert bomb.stat().st_size < 1 << 20
    big = tmp_path / "big.npz"  # stored, past the bound
    big.write_bytes(with_header(good, lambda h: json.dumps(h).encode()
                                + b" " * fmt.MAX_HEADER_BYTES))
    for path in (bomb, big):
        tracemalloc.start()
        try:
            with pytest.raises(fmt.Damaged):
                read_metadata(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, (path.name, peak)


def test_a_header_past_the_bound_is_not_written(tmp_path):
    ckpt = Checkpoints(tmp_path, CONFIG)
    with pytest.raises(CheckpointError, match="header.json .* more than the 8,388,608 a reader "
                                              "accepts"):
        ckpt.save(0, dict(w=np.zeros(3)), [dict(note="x" * (fmt.MAX_HEADER_BYTES + 1))])
    ckpt.close()
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.parametrize("found, words", [(1, "an older"), (3, "a newer")])
def test_other_formats_are_named_not_called_damaged(tmp_path, found, words):
    path = tmp_path / "t.npz"
    path.write_bytes(with_header(tables_file(tmp_path), lambda h: dict(h, format=found)))
    with pytest.raises(fmt.OldFormat, match=f"format {found}, written by {words} jdirect"):
        read_metadata(path)
