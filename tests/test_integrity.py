"""Restore checks every chunk it reads against the checksum recorded at save time."""

from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.engine.arrays.zarr import chunk_shape
from nbckpt.engine.restore.step import restore_step
from nbckpt.engine.save import leafplan, snapshot
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats import checksum
from nbckpt.formats.fsck import verify_step
from nbckpt.formats.layout import CHECKSUMS_DIR, all_steps

T = "tests.test_integrity"


@pytest.fixture(autouse=True)
def _no_hooks():
    hooks.clear_hooks()
    yield
    hooks.clear_hooks()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of at most 256 bytes, so that every array leaf has several."""
    small = functools.partial(chunk_shape, max_bytes=256)
    monkeypatch.setattr(snapshot, "chunk_shape", small)  # NumPy leaves'
    monkeypatch.setattr(leafplan, "chunk_shape", small)  # jax leaves'
    monkeypatch.setattr(leafplan, "_PLANS", {})  # none planned with other chunks


def _state():
    rng = np.random.default_rng(0)
    return {
        "w": jax.numpy.asarray(rng.standard_normal((64, 8)).astype(np.float32)),
        "zeros": np.zeros((32, 8), np.int32),  # a chunk of fill values must exist all the same
        "half": jax.numpy.asarray(rng.standard_normal((4, 4)), dtype=jax.numpy.bfloat16),
        "one": np.float64(2.5),
        "n": 3,
    }


def _save(root: Path, step: int = 1, tree=None) -> Path:
    # Every leaf its own zarr array: these tests damage chunk files (test_packs.py
    # damages the packs that small leaves go to by default).
    ck = AsyncCheckpointer(root, pack_bytes=0)
    ck.save(step, _state() if tree is None else tree)
    ck.wait_until_finished()
    return root / str(step)


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _chunk_files(leaf_dir: Path) -> list[Path]:
    return sorted(p for p in leaf_dir.iterdir() if not p.name.startswith("."))


def _flip(path: Path, at: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _sums_file(step_dir: Path) -> Path:
    return step_dir / CHECKSUMS_DIR / "process_0.json"


def test_intact_step_restores_bit_exact_and_records_crc32c(tmp_path, small_chunks):
    step = _save(tmp_path)
    assert len(_chunk_files(step / "w")) == 8  # 64x8 float32 in 256-byte chunks
    recorded = json.loads(_sums_file(step).read_text())
    assert recorded[checksum.ALGORITHM_KEY] == checksum.CRC32C
    assert sorted(recorded["w"]) == [f"{i}.0" for i in range(8)]
    out = AsyncCheckpointer(tmp_path).restore(1)
    ref = _state()
    for k in ("w", "zeros", "half", "one"):
        assert _same(out[k], ref[k]), k
    assert out["n"] == 3
    assert verify_step(step) == []


def test_crc32c_is_the_standard_one():
    # The check value of CRC-32C (RFC 3720) and of zlib's CRC-32, through numpy input.
    data = np.frombuffer(b"123456789", np.uint8)
    assert checksum.checksum(data, checksum.CRC32C) == 0xE3069283
    assert checksum.checksum(data, checksum.CRC32) == zlib.crc32(b"123456789")
    strided = np.arange(64, dtype=np.int16).reshape(8, 8)[:, ::2]
    expected = zlib.crc32(np.ascontiguousarray(strided).tobytes())
    assert checksum.checksum(strided, checksum.CRC32) == expected
    assert checksum.fast_crc32c()  # the engine extra's wheel has the compiled extension
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        checksum.checksum(data, "md5")


def test_a_flipped_byte_fails_the_restore_naming_leaf_chunk_and_step(tmp_path, small_chunks):
    step = _save(tmp_path)
    _flip(step / "w" / "3.0")
    ck = AsyncCheckpointer(tmp_path)
    with pytest.raises(CorruptCheckpointError) as err:
        ck.restore(1)
    text = str(err.value)
    assert str(step / "w" / "3.0") in text  # the step directory, the leaf and the chunk
    assert "leaf ['w']" in text and "chunk 3.0" in text and "checksum" in text
    # A restore of the other leaves only never reads the damaged one.
    out = ck.restore(1, target={"zeros": ..., "n": ...}, partial=True)
    assert _same(out["zeros"], np.zeros((32, 8), np.int32))


def test_a_flipped_byte_in_a_numpy_leaf_read_as_host_values(tmp_path, small_chunks):
    step = _save(tmp_path)
    _flip(step / "zeros" / "1.0", at=0)
    with pytest.raises(CorruptCheckpointError, match=r"leaf \['zeros'\] \(zeros\): chunk 1\.0"):
        AsyncCheckpointer(tmp_path).restore(1, target={"zeros": ...}, partial=True)


@pytest.mark.parametrize("leaf", ["w", "zeros"])
def test_a_deleted_chunk_file_fails_instead_of_reading_zeros(tmp_path, small_chunks, leaf):
    step = _save(tmp_path)
    (step / leaf / "2.0").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"chunk 2\.0 is missing") as err:
        AsyncCheckpointer(tmp_path).restore(1)
    assert str(step / leaf / "2.0") in str(err.value)
    assert f"{leaf}: chunk 2.0 missing" in verify_step(step)


def test_a_deleted_array_and_a_truncated_chunk_are_damage(tmp_path, small_chunks):
    step = _save(tmp_path)
    import shutil

    shutil.rmtree(step / "half")
    with pytest.raises(CorruptCheckpointError, match=r"leaf \['half'\].*array is missing"):
        AsyncCheckpointer(tmp_path).restore(1)
    step2 = _save(tmp_path, 2)
    (step2 / "w" / "0.0").write_bytes(b"\0" * 10)
    with pytest.raises(CorruptCheckpointError, match=r"chunk 0\.0 cannot be read"):
        AsyncCheckpointer(tmp_path).restore(2)


def test_old_crc32_checksums_are_still_verified(tmp_path, small_chunks):
    """A step saved before CRC-32C: zlib CRC-32 values and no algorithm recorded."""
    step = _save(tmp_path)
    new = json.loads(_sums_file(step).read_text())
    del new[checksum.ALGORITHM_KEY]
    old = {
        leaf: {key: zlib.crc32((step / leaf / key).read_bytes()) for key in chunks}
        for leaf, chunks in new.items()
    }
    # "n", a Python int, is stored as a 0-d array too (for Orbax), so it has a checksum.
    assert sorted(old) == ["half", "n", "one", "w", "zeros"]
    _sums_file(step).write_text(json.dumps(old))
    out = AsyncCheckpointer(tmp_path).restore(1)
    assert _same(out["w"], _state()["w"])
    assert verify_step(step) == []
    _flip(step / "w" / "7.0")
    with pytest.raises(CorruptCheckpointError, match=r"chunk 7\.0 does not match.*crc32 "):
        AsyncCheckpointer(tmp_path).restore(1)
    assert verify_step(step) == ["w: chunk 7.0 does not match its checksum"]


def test_a_chunk_without_a_recorded_checksum_is_damage(tmp_path, small_chunks):
    step = _save(tmp_path)
    sums = json.loads(_sums_file(step).read_text())
    del sums["w"]["5.0"]
    _sums_file(step).write_text(json.dumps(sums))
    with pytest.raises(CorruptCheckpointError, match=r"chunk 5\.0 has no recorded checksum"):
        AsyncCheckpointer(tmp_path).restore(1)
    _sums_file(step).write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="checksums cannot be read"):
        AsyncCheckpointer(tmp_path).restore(1)
    _sums_file(step).write_text(json.dumps({checksum.ALGORITHM_KEY: "sha3"}))
    with pytest.raises(CorruptCheckpointError, match="'sha3', which this nbckpt does not know"):
        AsyncCheckpointer(tmp_path).restore(1)


def test_a_step_without_checksums_restores_unverified(tmp_path, small_chunks):
    import shutil

    step = _save(tmp_path)
    # A step saved before checksums existed: no _CHECKSUMS, and metadata that says none,
    # under the name it had then (_CHECKPOINT_METADATA).
    shutil.rmtree(step / CHECKSUMS_DIR)
    meta = json.loads((step / "_NBCKPT_METADATA").read_text())
    del meta["checksums"]
    (step / "_NBCKPT_METADATA").unlink()
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps(meta))
    assert all_steps(tmp_path) == [1]
    _flip(step / "w" / "0.0", at=0)
    out = AsyncCheckpointer(tmp_path).restore(1)  # nothing recorded, nothing to check
    assert not _same(out["w"], _state()["w"])
    (step / "w" / "1.0").unlink()  # a missing chunk is still an error
    with pytest.raises(CorruptCheckpointError, match="is missing"):
        AsyncCheckpointer(tmp_path).restore(1)


def test_verify_false_skips_the_check(tmp_path, small_chunks):
    step = _save(tmp_path)
    _flip(step / "w" / "0.0", at=0)
    out = restore_step(step, None, verify=False)
    assert not _same(out["w"], _state()["w"])


def test_a_0d_array_and_an_empty_array_are_verified(tmp_path):
    tree = {"s": np.float32(1.5), "e": np.zeros((0, 3), np.float32), "j": jax.numpy.int8(7)}
    step = _save(tmp_path, tree=tree)
    out = AsyncCheckpointer(tmp_path).restore(1)
    for k, v in tree.items():
        assert _same(out[k], v), k
    _flip(step / "s" / "0", at=0)
    with pytest.raises(CorruptCheckpointError, match=r"leaf \['s'\] \(s\): chunk 0 does not"):
        AsyncCheckpointer(tmp_path).restore(1)


# -- dtype: a change happens only when asked ------------------------------------------


def test_a_target_of_another_dtype_is_refused_unless_cast(tmp_path):
    _save(tmp_path)
    ck = AsyncCheckpointer(tmp_path)
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    target = {"w": jax.ShapeDtypeStruct((64, 8), jax.numpy.int8, sharding=sharding)}
    refused = r"\['w'\] asks for dtype int8, but it was saved as float32"
    with pytest.raises(ValueError, match=refused):
        ck.restore(1, target=target, partial=True)
    with pytest.raises(ValueError, match="saved as float32") as err:
        restore_step(
            tmp_path / "1", {"w": jax.numpy.zeros((64, 8), jax.numpy.float16)}, partial=True
        )
    assert "\n" not in str(err.value) and "cast=True" in str(err.value)
    out = ck.restore(1, target=target, cast=True, partial=True)
    assert out["w"].dtype == jax.numpy.int8
    assert _same(out["w"], np.asarray(_state()["w"]).astype(np.int8))
    same = {"w": jax.ShapeDtypeStruct((64, 8), jax.numpy.float32, sharding=sharding)}
    assert _same(ck.restore(1, target=same, partial=True)["w"], _state()["w"])


# -- a target that cuts chunks (two devices, one process) ------------------------------


def reshard_task(root: str, flip: bool) -> str:
    """Save rows split over 2 devices, restore columns split: each device cuts chunks."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    value = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    rows = jax.device_put(value, NamedSharding(mesh, P("x", None)))
    leafplan.chunk_shape = functools.partial(chunk_shape, max_bytes=48)  # 2-row chunks
    leafplan._PLANS.clear()
    try:
        ck = AsyncCheckpointer(root, pack_bytes=0)  # its chunk files are damaged below
        ck.save(1, {"v": rows})
        ck.wait_until_finished()
    finally:
        leafplan.chunk_shape = chunk_shape
        leafplan._PLANS.clear()
    if flip:
        _flip(Path(root) / "1" / "v" / "3.0")
    cols = NamedSharding(mesh, P(None, "x"))
    try:
        out = ck.restore(1, target={"v": cols})
    except CorruptCheckpointError as e:
        return str(e)
    assert out["v"].sharding == cols
    for shard in out["v"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), value[shard.index])
    return "ok"


@pytest.mark.multihost
def test_a_target_that_cuts_chunks_still_verifies_whole_chunks(group1, tmp_path):
    assert group1.run(f"{T}:reshard_task", str(tmp_path / "a"), False) == ["ok"]
    [err] = group1.run(f"{T}:reshard_task", str(tmp_path / "b"), True)
    assert "chunk 3.0 does not match" in err
