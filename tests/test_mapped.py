"""Restored values that map their step's packs: alike, safe from writes, and lasting."""

from __future__ import annotations

import functools
import gc
import os
import platform
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.arrays.zarr import chunk_shape
from nbckpt.engine.restore import bulk, mapped, reads
from nbckpt.engine.save import leafplan
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats.fsck import verify_step
from nbckpt.formats.packs import PACK_DIR
from nbckpt.storage.local import file_system


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = platform.release().split(".")
    return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)


def _state() -> dict[str, object]:
    rng = np.random.default_rng(3)
    return {
        # 8 MiB: its own array, whose chunk file is read, not mapped.
        "big": jax.numpy.asarray(rng.standard_normal((2048, 1024)).astype(np.float32)),
        # Small: packed (read as mapped stretches of the pack).
        "bias": [
            jax.numpy.asarray(rng.standard_normal(100 + i).astype(np.float32)) for i in range(6)
        ],
        "count": jax.numpy.int32(5),
        "host": np.arange(12, dtype=np.int64).reshape(3, 4),
    }


def _save(root: Path) -> Path:
    ck = AsyncCheckpointer(root)
    ck.save(1, _state())
    ck.wait_until_finished()
    return root / "1"


def _bytes(tree: object) -> list[bytes]:
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def _mappings(step: Path) -> list[str]:
    with open("/proc/self/maps", encoding="utf-8") as f:
        return [line for line in f if str(step) in line]


def _flip_a_bit(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))


def test_this_linux_maps_restores_on_local_file_systems_only(tmp_path, monkeypatch):
    # The project's machines run Linux 5.14 or later: a restore there maps.
    if platform.system() == "Linux" and _kernel_at_least(5, 14):
        assert mapped.can_map(tmp_path)
        assert file_system("/proc/self") == "proc"
        assert not mapped.can_map("/proc/self")
    # A file system not known to be local (a network one, say) is read.
    monkeypatch.setattr(mapped, "LOCAL_FILE_SYSTEMS", frozenset())
    assert not mapped.can_map(tmp_path)


def test_a_mapped_range_is_the_files_bytes_and_a_write_stays_in_the_process(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 3 * 4096 + 100, np.uint8).tobytes()
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = mapped.map_range(fd, 5000, 9000)
        assert got is not None
        view, end = got
        assert end == 9000 and view.tobytes() == data[5000:9000]
        # Past the file's end: the view stops where the file does.
        tail = mapped.map_range(fd, 12000, 20000)
        assert tail is not None and tail[1] == len(data) and tail[0].tobytes() == data[12000:]
        empty = mapped.map_range(fd, len(data) + 10, len(data) + 20)
        assert empty is not None and empty[0].size == 0
        view[:] = 0  # copy-on-write: the file keeps its bytes
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_a_restore_maps_its_files_and_gives_what_reading_gives(tmp_path, monkeypatch):
    step = _save(tmp_path)
    want = _bytes(_state())
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(out) == want
    # The pack and the large leaf's chunk file are mapped while the values live (where
    # the system can, see the test above).
    files = {line.split()[-1] for line in _mappings(step)}
    mine = {str(step / PACK_DIR / "process_0"), str(step / "big" / "0.0")}
    assert files == (mine if mapped.can_map(step) else set())
    del out
    gc.collect()
    assert _mappings(step) == []  # and let go with them
    monkeypatch.setattr(bulk, "can_map", lambda directory: False)
    monkeypatch.setattr(reads, "can_map", lambda directory: False)
    read = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(read) == want and _mappings(step) == []


def test_a_donated_restored_value_never_writes_its_step(tmp_path):
    step = _save(tmp_path)
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    bump = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)
    bumped = bump({"big": out["big"], "bias": out["bias"]})
    assert np.asarray(bumped["big"])[0, 0] == np.asarray(_state()["big"])[0, 0] + 1  # type: ignore[index]
    assert verify_step(step) == []
    again = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(again) == _bytes(_state())


def test_values_restored_from_a_step_outlive_its_removal(tmp_path):
    step = _save(tmp_path)
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    shutil.rmtree(step)
    assert not step.exists()
    assert _bytes(out) == _bytes(_state())


def test_a_pack_cut_short_under_a_mapping_is_damage_not_a_crash(tmp_path):
    step = _save(tmp_path)
    pack = step / PACK_DIR / "process_0"
    os.truncate(pack, pack.stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match="is cut short"):
        AsyncCheckpointer(tmp_path).restore(1, target=_state())


def test_a_chunk_file_cut_short_or_changed_under_a_mapping_is_damage_named(tmp_path):
    step = _save(tmp_path)
    chunk = step / "big" / "0.0"
    _flip_a_bit(chunk, 12345)
    with pytest.raises(CorruptCheckpointError, match=r"big.*chunk 0\.0 does not match"):
        AsyncCheckpointer(tmp_path).restore(1, target=_state())
    os.truncate(chunk, chunk.stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match=r"big.*chunk 0\.0 cannot be read"):
        AsyncCheckpointer(tmp_path).restore(1, target=_state())


def test_a_numpy_leaf_comes_back_writable_and_its_writes_stay_in_the_process(tmp_path):
    # A small one is packed (its own copy of the mapped stretch), a large one mapped.
    tree = {
        "h": np.arange(2**21, dtype=np.float32).reshape(1024, 2048),
        "s": np.arange(10, dtype=np.int32),
    }
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, tree)
    ck.wait_until_finished()
    out = AsyncCheckpointer(tmp_path).restore(1, target=tree)
    for name in ("h", "s"):
        assert isinstance(out[name], np.ndarray) and out[name].flags.writeable
        out[name].reshape(-1)[0] = -1
    assert verify_step(tmp_path / "1") == []
    again = AsyncCheckpointer(tmp_path).restore(1, target=tree)
    assert _bytes(again) == _bytes(tree)


def test_the_environment_can_turn_mapping_off(tmp_path, monkeypatch):
    step = _save(tmp_path)
    monkeypatch.setenv(mapped.MAP_ENV, "0")
    assert not mapped.can_map(step)
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(out) == _bytes(_state()) and _mappings(step) == []


def test_a_range_that_cannot_be_read_in_mapped_is_read_instead(tmp_path, monkeypatch):
    step = _save(tmp_path)
    monkeypatch.setattr(mapped, "_POPULATE_READ", 9999)  # the kernel refuses the advice
    fd = os.open(step / PACK_DIR / "process_0", os.O_RDONLY)
    try:
        assert mapped.map_range(fd, 0, 100) is None
    finally:
        os.close(fd)
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(out) == _bytes(_state()) and _mappings(step) == []


def test_files_mapped_end_to_end_are_their_bytes_and_let_go_with_their_last_view(tmp_path):
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 256, n, np.uint8).tobytes() for n in (2 * 4096, 4096, 1000)]
    paths = []
    for i, data in enumerate(parts):
        paths.append(tmp_path / f"c{i}")
        paths[-1].write_bytes(data)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        view = mapped.map_files(fds, [len(d) for d in parts])
        # A file that does not end on a page boundary cannot be followed by another.
        assert mapped.map_files(fds[::-1], [len(d) for d in parts[::-1]]) is None
    finally:
        for fd in fds:
            os.close(fd)
    assert view is not None and view.tobytes() == b"".join(parts)
    view[:] = 0  # copy-on-write: the files keep their bytes
    assert [p.read_bytes() for p in paths] == parts
    assert len(_mappings(tmp_path)) == 3
    tail = view[-10:]
    del view
    gc.collect()
    assert len(_mappings(tmp_path)) == 3  # a view of it holds the mapping
    del tail
    gc.collect()
    assert _mappings(tmp_path) == []


def test_a_shard_of_several_chunks_is_restored_as_its_chunk_files_mapped(tmp_path, monkeypatch):
    # The save splits a shard over 64 MiB into chunks; here over 1 MiB, so that the
    # restore of an 8 MiB leaf meets a region of 8 whole chunk files.
    few = functools.partial(chunk_shape, max_bytes=1 << 20)
    monkeypatch.setattr(leafplan, "chunk_shape", few)
    monkeypatch.setattr(leafplan, "_PLANS", {})  # none planned with other chunks
    step = _save(tmp_path)
    assert len(list((step / "big").glob("*.0"))) == 8
    want = _bytes(_state())
    out = AsyncCheckpointer(tmp_path).restore(1, target=_state())
    assert _bytes(out) == want
    files = {line.split()[-1] for line in _mappings(step / "big")}
    chunks = {str(step / "big" / f"{i}.0") for i in range(8)}
    assert files == (chunks if mapped.can_map(step) else set())
    # Damage in any of them is named, as when each is read.
    del out
    gc.collect()
    assert _mappings(step) == []
    _flip_a_bit(step / "big" / "5.0", 777)
    with pytest.raises(CorruptCheckpointError, match=r"big.*chunk 5\.0 does not match"):
        AsyncCheckpointer(tmp_path).restore(1, target=_state())
    os.truncate(step / "big" / "6.0", 100)
    with pytest.raises(CorruptCheckpointError, match=r"big.*chunk 6\.0 cannot be read"):
        AsyncCheckpointer(tmp_path).restore(1, target=_state())
