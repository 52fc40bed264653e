"""Large chunk files and packs written with O_DIRECT: the same bytes, durable, safe on failure."""

from __future__ import annotations

import errno
import gc
import hashlib
import mmap
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.save import direct
from nbckpt.errors import CheckpointError
from nbckpt.formats.fsck import verify_step
from nbckpt.formats.layout import all_steps
from nbckpt.formats.packs import pack_file
from nbckpt.storage.local import file_system


def _aligned(nbytes: int, seed: int = 0) -> np.ndarray:
    """Random bytes in a mapping of their own: page-aligned, as a large shard's copy."""
    m = mmap.mmap(-1, max(nbytes, 1))
    out = np.frombuffer(m, np.uint8)[:nbytes]
    out[:] = np.random.default_rng(seed).integers(0, 256, nbytes, np.uint8)
    return out


def _state() -> dict[str, object]:
    rng = np.random.default_rng(7)
    return {
        # 4 MiB + 4 KiB: its own array, written here (a whole number of blocks).
        "big": jax.numpy.asarray(rng.standard_normal((1025, 1024)).astype(np.float32)),
        # 6 MiB + 12 bytes: written here, with a tail through the page cache.
        "odd": rng.standard_normal((1572867,)).astype(np.float32),
        "small": jax.numpy.arange(10, dtype=jax.numpy.float32),
    }


def _chunk_files(step: Path) -> dict[str, str]:
    return {
        str(p.relative_to(step)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(step.rglob("*"))
        if p.is_file() and p.parent.name in ("big", "odd")
    }


def test_this_machine_writes_direct_on_ext4_and_xfs_only(tmp_path, monkeypatch):
    monkeypatch.delenv(direct.DIRECT_ENV, raising=False)
    # The project's machines keep their temporary files on ext4.
    assert direct.can_write_direct(tmp_path) == (file_system(tmp_path) in ("ext4", "xfs"))
    assert file_system(tmp_path) == "ext4"
    assert not direct.can_write_direct("/dev/shm")  # tmpfs: no device to write to
    assert not direct.can_write_direct("/proc/self")
    monkeypatch.setenv(direct.DIRECT_ENV, "0")
    assert not direct.can_write_direct(tmp_path)


def test_what_suits_a_direct_write():
    big = _aligned(2 << 20).view(np.float32)
    assert direct.suits(big, whole=True)
    assert not direct.suits(big, whole=False)  # an edge chunk is stored padded
    assert not direct.suits(big[: (1 << 18) - 1], whole=True)  # under MIN_BYTES
    assert direct.suits(_aligned((2 << 20) + 1)[1:], whole=True)  # copied through a stage
    assert not direct.suits(big.reshape(512, 1024)[:, :512], whole=True)  # not contiguous
    assert not direct.suits(big.view(">f4"), whole=True)  # not the stored byte order


def _open_flags(monkeypatch) -> list[int]:
    """The flags of every file ``direct`` opens from now on, in order."""
    opened: list[int] = []
    real_open = os.open

    def spy(path, flags, *args):
        opened.append(flags)
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct.os, "open", spy)
    return opened


@pytest.mark.parametrize("nbytes", [direct.BLOCK * 300, direct.BLOCK * 300 + 100, 100])
def test_a_file_written_direct_holds_the_bytes(tmp_path, monkeypatch, nbytes):
    opened = _open_flags(monkeypatch)
    data = _aligned(nbytes, seed=nbytes)
    path = tmp_path / "leaf" / "0.0"  # its folder is made
    direct.write_file(path, data).result()
    assert path.read_bytes() == data.tobytes()
    assert opened and opened[0] & os.O_DIRECT


def _pieces(seed: int) -> tuple[list[tuple[int, np.ndarray]], int, bytes]:
    """A pack's pieces: small, at 64-byte steps, one larger than a staging buffer."""
    rng = np.random.default_rng(seed)
    pieces, at = [], 0
    for size in [5, 4096, 64, 3 * direct.BLOCK + 1, 1, 2 * direct.BLOCK * 3 + 9, 777]:
        start = -(-at // 64) * 64
        pieces.append((start, rng.integers(0, 256, size, np.uint8)))
        at = start + size
    want = bytearray(at)
    for start, piece in pieces:
        want[start : start + piece.nbytes] = piece.tobytes()
    return pieces, at, bytes(want)


def test_a_gathered_file_holds_its_pieces_with_zeros_between(tmp_path, monkeypatch):
    # Buffers of two blocks: pieces span buffers, and one spans several.
    monkeypatch.setattr(direct, "STAGE_BYTES", 2 * direct.BLOCK)
    monkeypatch.setattr(direct, "_stages", {})
    opened = _open_flags(monkeypatch)
    pieces, nbytes, want = _pieces(3)
    counted: list[int] = []
    path = tmp_path / "w" / "pack"
    direct.write_gathered(path, pieces, nbytes, counted.append)
    assert path.read_bytes() == want
    assert opened and opened[0] & os.O_DIRECT
    assert sum(counted) == sum(p.nbytes for _, p in pieces) and len(counted) > 2
    # The buffer is kept for the next file, not made again.
    assert [len(kept) for kept in direct._stages.values()] == [1]
    direct.write_gathered(tmp_path / "again", pieces, nbytes)
    assert [len(kept) for kept in direct._stages.values()] == [1]
    assert (tmp_path / "again").read_bytes() == want


@pytest.mark.parametrize("blocks", [5, 6, 13])
def test_bytes_off_a_block_go_direct_through_a_kept_stage(tmp_path, monkeypatch, blocks):
    """A CPU array's own buffer starts off a block: it is copied a stretch at a time."""
    monkeypatch.setattr(direct, "CHUNK_STAGE_BYTES", 3 * direct.BLOCK)
    monkeypatch.setattr(direct, "_stages", {})
    opened = _open_flags(monkeypatch)
    writes: list[tuple[int, int, int]] = []  # (address % BLOCK, length, offset)
    real_pwrite = os.pwrite

    def spy(fd, data, offset):
        address = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
        writes.append((address % direct.BLOCK, len(data), offset))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", spy)
    data = _aligned(blocks * direct.BLOCK + 64 + 10, seed=blocks)[64:]  # 64 past a page
    assert data.__array_interface__["data"][0] % direct.BLOCK == 64
    path = tmp_path / "leaf" / "0"
    direct.write_file(path, data).result()
    assert path.read_bytes() == data.tobytes()
    assert opened and opened[0] & os.O_DIRECT
    # Whole blocks from the stage's start, at block offsets; the 10-byte tail after them.
    direct_writes = [w for w in writes if w[1] % direct.BLOCK == 0]
    assert all(w[0] == 0 and w[2] % direct.BLOCK == 0 for w in direct_writes)
    assert sum(w[1] for w in writes) == data.nbytes and writes[-1][1] == 10
    assert max(w[1] for w in writes) <= 3 * direct.BLOCK
    assert [len(kept) for kept in direct._stages.values()] == [1]


@pytest.mark.parametrize("gathered", [False, True])
def test_a_file_system_that_refuses_direct_writes_gets_them_through_the_page_cache(
    tmp_path, monkeypatch, gathered
):
    real_pwrite = os.pwrite

    def refuse(fd, data, offset):
        if _flags(fd) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", refuse)
    if gathered:
        monkeypatch.setattr(direct, "STAGE_BYTES", 2 * direct.BLOCK)
        monkeypatch.setattr(direct, "_stages", {})
        pieces, nbytes, want = _pieces(4)
        direct.write_gathered(tmp_path / "f", pieces, nbytes)
        assert (tmp_path / "f").read_bytes() == want
        return
    data = _aligned(direct.BLOCK * 10 + 7, seed=1)
    direct.write_file(tmp_path / "f", data).result()
    assert (tmp_path / "f").read_bytes() == data.tobytes()


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.mark.parametrize("gathered", [False, True])
def test_a_failed_direct_write_leaves_no_file(tmp_path, monkeypatch, gathered):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct.os, "fdatasync", full)
    with pytest.raises(OSError, match=r"No space left.*'.*/f'"):
        if gathered:
            pieces, nbytes, _ = _pieces(5)
            direct.write_gathered(tmp_path / "f", pieces, nbytes)
        else:
            direct.write_file(tmp_path / "f", _aligned(direct.BLOCK * 4)).result()
    assert not (tmp_path / "f").exists()


def test_a_save_writes_large_chunks_direct_with_the_bytes_tensorstore_writes(tmp_path, monkeypatch):
    written: list[Path] = []
    real_write, real_gathered = direct._write, direct.write_gathered

    def spy(path, part):
        written.append(path)
        return real_write(path, part)

    def spy_gathered(path, pieces, nbytes, progress=None):
        written.append(path)
        return real_gathered(path, pieces, nbytes, progress)

    monkeypatch.setattr(direct, "_write", spy)
    monkeypatch.setattr(direct, "write_gathered", spy_gathered)
    monkeypatch.delenv(direct.DIRECT_ENV, raising=False)
    steps = {}
    for env in ("1", "0"):
        monkeypatch.setenv(direct.DIRECT_ENV, env)
        ck = AsyncCheckpointer(tmp_path / env)
        ck.save(1, _state())
        ck.wait_until_finished()
        steps[env] = tmp_path / env / "1"
        assert verify_step(steps[env]) == []
        out = ck.restore(1, target=_state())
        for name, want in _state().items():
            assert np.asarray(out[name]).tobytes() == np.asarray(want).tobytes(), name
    # Both large leaves and the pack (of the small one), and only they, went here, and
    # only with the setting on; the files are those tensorstore and a plain write make.
    assert sorted(p.parent.name for p in written) == ["_PACKED", "big", "odd"]
    assert all(str(p).startswith(str(tmp_path / "1")) for p in written)
    assert _chunk_files(steps["1"]) == _chunk_files(steps["0"]) != {}
    pack = pack_file(0)
    assert (steps["1"] / pack).read_bytes() == (steps["0"] / pack).read_bytes() != b""


def _mount_ext4(image: Path, mnt: Path, size_mib: int) -> None:
    subprocess.run(["truncate", "-s", f"{size_mib}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mnt.mkdir()
    res = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount an ext4 image (the test needs root): {res.stderr!r}")


def test_a_full_ext4_disk_under_direct_writes_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(direct.DIRECT_ENV, raising=False)
    written: list[str] = []
    real_write = direct._write

    def spy(path, part):
        written.append(path.parent.parent.name)
        return real_write(path, part)

    monkeypatch.setattr(direct, "_write", spy)
    mnt = tmp_path / "small"
    _mount_ext4(tmp_path / "ext4.img", mnt, 24)
    try:
        root = mnt / "ckpt"
        assert direct.can_write_direct(root)
        ck = AsyncCheckpointer(root)
        first = {"w": np.full((1025, 1024), 2.0, np.float32)}  # 4 MiB + 4 KiB: written direct
        ck.save(1, first)
        ck.wait_until_finished()
        ck.save(2, {"w": np.ones((8, 1024, 1024), np.float32)})  # 32 MiB > the disk
        with pytest.raises(CheckpointError) as info:
            ck.wait_until_finished()
        msg = str(info.value)
        assert "is full" in msg and str(root / "2.nbckpt-tmp" / "w") in msg
        assert len(msg.splitlines()) == 1
        assert all_steps(root) == [1]
        # No half-written chunk; the array's .zarray may be there (the primary writes it
        # while the chunks are written), in a working directory never published.
        left = {p.name for p in (root / "2.nbckpt-tmp" / "w").iterdir()}
        assert left <= {".zarray"}
        assert written == ["1.nbckpt-tmp", "2.nbckpt-tmp"]  # both were written direct
        assert verify_step(root / "1") == []
        restored = ck.restore(1)
        assert np.array_equal(restored["w"], first["w"])
        # The restored value maps its chunk file: the disk stays busy while it lives.
        del restored
        gc.collect()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
