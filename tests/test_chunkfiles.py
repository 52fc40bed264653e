"""A restore reads whole raw chunks of a local step from their files, straight into its buffers."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import jax
import numpy as np
import pytest
import tensorstore as ts
from hypothesis import event, given, settings
from hypothesis import strategies as st

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.arrays.zarr import chunk_shape, open_array
from nbckpt.engine.restore import chunkfiles
from nbckpt.engine.restore.reads import aligned_empty
from nbckpt.engine.save import leafplan, snapshot
from nbckpt.formats import checksum


def _array(path: Path, data: np.ndarray, chunks: list[int], **extra) -> ts.TensorStore:
    meta = {"shape": list(data.shape), "chunks": chunks, "dtype": data.dtype.str}
    meta |= {"compressor": None, **extra}
    if data.dtype == jax.numpy.bfloat16:
        meta["dtype"] = "bfloat16"
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}
    store = ts.open(spec | {"metadata": meta}, create=True, delete_existing=True).result()
    store.write(data).result()
    return ts.open(spec).result()


def _read(path: Path, store: ts.TensorStore, box, chunks, sums=None) -> np.ndarray | None:
    shape = tuple(store.shape)
    buf = aligned_empty(tuple(b - a for a, b in box), store.dtype.numpy_dtype)
    done = chunkfiles.read_region(path, store, box, shape, chunks, buf, sums)
    if done is None:
        return None
    done.result(timeout=30)
    return buf


def _file_sums(path: Path, box, chunks) -> dict[str, int]:
    """The CRC-32C of each chunk file of ``box``, by chunk key."""
    grid = [range(a // c, -(-b // c)) for (a, b), c in zip(box, chunks, strict=True)]
    keys = [".".join(map(str, ix)) for ix in itertools.product(*grid)]
    return {k: checksum.checksum((path / k).read_bytes(), checksum.CRC32C) for k in keys}


@st.composite
def _cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 8), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(["<f4", "|u1", "|b1", "<i8", "bfloat16"]))
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    chunks = chunk_shape(shape, itemsize, max_bytes=draw(st.sampled_from([16, 64, 10_000])))
    # A box on the chunk grid: from one chunk boundary to another, per dimension.
    box = []
    for d, c in zip(shape, chunks, strict=True):
        edges = sorted({*range(0, d, c), d})
        a = draw(st.sampled_from(edges[:-1]))
        b = draw(st.sampled_from([e for e in edges if e > a]))
        box.append((a, b))
    return shape, np.dtype(jax.numpy.bfloat16 if dtype == "bfloat16" else dtype), chunks, box


@settings(deadline=None, max_examples=60)  # each example writes a zarr array
@given(case=_cases())
def test_a_region_reads_the_same_bytes_as_tensorstore(tmp_path_factory, case):
    shape, dtype, chunks, box = case
    path = tmp_path_factory.mktemp("a")
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, size=shape).astype(dtype)
    store = _array(path, data, chunks)
    sums: dict[str, int] = {}
    got = _read(path, store, tuple(box), chunks, sums)
    want = data[tuple(slice(a, b) for a, b in box)]
    event("left to tensorstore" if got is None else "read from the files")
    if got is None:  # tensorstore reads it, as before
        return
    assert got.tobytes() == want.tobytes()
    # Each chunk got the checksum of its file's bytes, computed as it was read.
    assert sums == _file_sums(path, box, chunks)


def test_a_chunk_is_checksummed_piece_by_piece_as_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(chunkfiles, "SUM_PIECE", 40)  # 4 KiB chunks: pieces, one cut short
    data = np.random.default_rng(2).standard_normal((8, 1024)).astype(np.float32)
    store = _array(tmp_path, data, [1, 1024])
    sums: dict[str, int] = {}
    got = _read(tmp_path, store, ((2, 5), (0, 1024)), [1, 1024], sums)
    assert got is not None and got.tobytes() == data[2:5].tobytes()
    assert sums == _file_sums(tmp_path, ((2, 5), (0, 1024)), [1, 1024])
    assert len(sums) == 3
    # A chunk that tensorstore reads (its file is of the wrong size) gets no sum.
    (tmp_path / "3.0").write_bytes(b"\0" * 5)
    sums.clear()
    with pytest.raises(ValueError, match="Not enough data"):
        _read(tmp_path, store, ((2, 5), (0, 1024)), [1, 1024], sums)
    assert "3.0" not in sums


def test_regions_it_cannot_read_whole_are_left_to_tensorstore(tmp_path):
    data = np.arange(48, dtype=np.float32).reshape(6, 8)
    store = _array(tmp_path, data, [6, 4])
    assert _read(tmp_path, store, ((0, 6), (0, 4)), [6, 4]) is not None  # one whole chunk
    # Two chunks side by side: each is a strided part of the region's buffer.
    assert _read(tmp_path, store, ((0, 6), (0, 8)), [6, 4]) is None
    edge = _array(tmp_path / "edge", np.arange(10, dtype=np.int32), [4])
    assert _read(tmp_path / "edge", edge, ((8, 10),), [4]) is None  # stored padded
    assert _read(tmp_path / "edge", edge, ((0, 8),), [4]) is not None
    squeezed = _array(tmp_path / "z", data, [6, 8], compressor={"id": "zlib", "level": 1})
    assert not chunkfiles.is_raw(squeezed)
    assert _read(tmp_path / "z", squeezed, ((0, 6), (0, 8)), [6, 8]) is None


def test_a_missing_or_wrong_sized_chunk_file_is_read_by_tensorstore(tmp_path):
    data = np.arange(32, dtype=np.float32)
    store = _array(tmp_path, data, [8])
    (tmp_path / "1").write_bytes(b"\0" * 5)  # wrong size: tensorstore says why
    with pytest.raises(ValueError, match=r"FAILED_PRECONDITION.*/1\": Not enough data"):
        _read(tmp_path, store, ((0, 32),), [8])
    (tmp_path / "1").unlink()
    strict = open_array(tmp_path, fill_missing=False)  # as a restore opens it
    with pytest.raises(ValueError, match="NOT_FOUND"):
        _read(tmp_path, strict, ((8, 16),), [8])


def test_a_restore_reads_its_chunks_from_the_files(tmp_path, monkeypatch):
    small = functools.partial(chunk_shape, max_bytes=256)
    monkeypatch.setattr(snapshot, "chunk_shape", small)  # NumPy leaves'
    monkeypatch.setattr(leafplan, "chunk_shape", small)  # jax leaves'
    monkeypatch.setattr(leafplan, "_PLANS", {})  # none planned with other chunks
    reads: list[Path] = []
    real = chunkfiles._read_file
    monkeypatch.setattr(
        chunkfiles,
        "_read_file",
        lambda path, into, extend: reads.append(path) or real(path, into, extend),
    )
    # With the sums computed as the chunks were read, none is checksummed again.
    rechecked: list[int] = []
    real_matches = checksum.matches
    monkeypatch.setattr(
        checksum, "matches", lambda d, a, e: rechecked.append(d.nbytes) or real_matches(d, a, e)
    )
    rng = np.random.default_rng(1)
    tree = {
        "w": jax.numpy.asarray(rng.standard_normal((64, 8)).astype(np.float32)),
        "h": jax.numpy.asarray(rng.standard_normal((32, 4)), dtype=jax.numpy.bfloat16),
    }
    ck = AsyncCheckpointer(tmp_path, pack_bytes=0)
    ck.save(1, tree)
    ck.wait_until_finished()
    out = AsyncCheckpointer(tmp_path).restore(1, target=tree)
    for k, v in tree.items():
        assert np.asarray(out[k]).tobytes() == np.asarray(v).tobytes()
    # Every chunk of both leaves came from its file: 64x8 f32 in 256-byte chunks is 8.
    assert len({p for p in reads if p.parent.name == "w"}) == 8
    assert len({p for p in reads if p.parent.name == "h"}) == 1
    assert rechecked == []
