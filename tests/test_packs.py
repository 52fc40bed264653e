"""Small leaves packed per process: layout, round trip, damage, and the Orbax mode."""

from __future__ import annotations

import gc
import json
import os
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.restore import chunkfiles, packed
from nbckpt.engine.restore import step as restore_step
from nbckpt.errors import CorruptCheckpointError
from nbckpt.formats import checksum
from nbckpt.formats.checksum import read_checksums
from nbckpt.formats.fsck import verify_step
from nbckpt.formats.layout import CHECKSUMS_DIR
from nbckpt.formats.packs import PACK_ALIGN, PACK_DIR, PACK_KEY, PackIndex, unit_files
from nbckpt.pools import LazyPool

T = "tests.test_packs"


def _state() -> dict[str, object]:
    rng = np.random.default_rng(1)
    return {
        # 8 MiB on one device: its one shard is above the default pack_bytes (4 MiB).
        "big": jax.numpy.asarray(rng.standard_normal((2048, 1024)).astype(np.float32)),
        "layers": [
            {
                "bias": jax.numpy.asarray(rng.standard_normal(64 * (i + 1)).astype(np.float32)),
                "scale": np.full((8, 8), i, np.int16),
            }
            for i in range(5)
        ],
        "half": jax.numpy.asarray(rng.standard_normal((4, 4)), dtype=jax.numpy.bfloat16),
        "count": jax.numpy.int32(7),
        "lr": 3e-4,
        "empty": np.zeros((0, 3), np.float32),
    }


def _save(root: Path, step: int = 1, **kw: object) -> Path:
    ck = AsyncCheckpointer(root, **kw)  # type: ignore[arg-type]
    ck.save(step, _state())
    ck.wait_until_finished()
    return root / str(step)


def _same(a: object, b: object) -> bool:
    x, y = np.asarray(a), np.asarray(b)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _sums(step: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((step / CHECKSUMS_DIR / "process_0.json").read_text())
    return data


def test_small_leaves_go_into_one_pack_and_large_ones_keep_their_arrays(tmp_path):
    step = _save(tmp_path)
    names = {p.name for p in step.iterdir()}
    assert {"big", "empty", PACK_DIR} <= names
    assert not names & {"layers.0.bias", "half", "count", "lr"}  # no folder per small leaf
    assert sorted(p.name for p in (step / PACK_DIR).iterdir()) == ["process_0"]
    meta = json.loads((step / "_NBCKPT_METADATA").read_text())
    flags = {m["name"]: bool(m.get("packed")) for m in meta["leaves"]}
    assert flags["big"] is False and flags["empty"] is False
    assert flags["half"] and flags["count"] and flags["lr"]
    assert all(flags[n] for n in flags if n.startswith("layers"))
    # Orbax cannot read packed leaves: no Orbax records that would send it there.
    assert "_METADATA" not in names
    index = _sums(step)[PACK_KEY]
    assert isinstance(index, dict) and index["file"] == f"{PACK_DIR}/process_0"
    spans = sorted(s for keys in index["chunks"].values() for s in keys.values())
    # The chunks lie in order, each at the first multiple of PACK_ALIGN after the one
    # before, and the last ends the pack.
    ends = [a + n for a, n in spans]
    assert [a for a, _ in spans] == [0, *(-(-e // PACK_ALIGN) * PACK_ALIGN for e in ends[:-1])]
    assert ends[-1] == (step / PACK_DIR / "process_0").stat().st_size


def test_the_pack_is_on_its_way_before_any_chunk_is_summed(tmp_path, monkeypatch):
    # Summing 54 MiB of chunks before the pack's one write left the disk idle for
    # 12-23 ms of a 256 MiB save: the pack now starts first, and every chunk,
    # packed or not, is still summed into the step's checksums.
    from nbckpt.engine.save import writer

    seen: list[str] = []
    started, summed = writer._Pack.write, checksum.checksum

    def write(self, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append("pack")
        return started(self, *a, **kw)

    def sum_(part, algorithm):  # type: ignore[no-untyped-def]
        seen.append("sum")
        return summed(part, algorithm)

    monkeypatch.setattr(writer._Pack, "write", write)
    monkeypatch.setattr(checksum, "checksum", sum_)
    step = _save(tmp_path)
    assert seen[0] == "pack" and seen.count("pack") == 1
    sums = _sums(step)
    assert set(sums["big"]) and all(len(sums[f"layers.{i}.bias"]) == 1 for i in range(5))
    assert seen.count("sum") == sum(len(v) for k, v in sums.items() if not k.startswith(("#", "_")))
    assert verify_step(step) == []


def test_a_packed_step_restores_bit_exact_with_and_without_a_target(tmp_path):
    _save(tmp_path)
    ck = AsyncCheckpointer(tmp_path)
    want = _state()
    for out in (ck.restore(1), ck.restore(1, target=jax.tree.map(lambda x: x, want))):
        assert _same(out["big"], want["big"]) and _same(out["half"], want["half"])
        for got, w in zip(out["layers"], want["layers"], strict=True):  # type: ignore[arg-type]
            assert _same(got["bias"], w["bias"]) and _same(got["scale"], w["scale"])
        assert int(out["count"]) == 7 and out["lr"] == 3e-4 and out["empty"].shape == (0, 3)
        assert isinstance(out["layers"][0]["bias"], jax.Array)
    one = ck.restore(1, target={"layers": [{}, {}, {"bias": ...}]}, partial=True)
    assert _same(one["layers"][2]["bias"], want["layers"][2]["bias"])  # type: ignore[index]
    assert verify_step(tmp_path / "1") == []


def test_saves_and_restores_after_the_first_start_no_thread_but_the_saves_own(
    tmp_path, monkeypatch
):
    # Their pools are kept (nbckpt.pools): making threads anew cost a small restore more
    # than reading its checksums files. A step holds a pack, a chunk file and checks.
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    ck.wait_until_finished()
    ck.restore(1)
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for step in (2, 3):
        ck.save(step, _state())
        ck.wait_until_finished()
        out = ck.restore(step)
        assert _same(out["big"], _state()["big"])
    # Each save's background job; and a kept pool may still grow, up to its size, when
    # a batch (of fsyncs, say) finds its threads busy: never twice the same thread.
    assert [n for n in started if n.startswith("nbckpt-save-")] == [
        "nbckpt-save-2",
        "nbckpt-save-3",
    ]
    kept = {p.prefix: p.threads for p in gc.get_objects() if isinstance(p, LazyPool)}
    grown = [n.rpartition("_") for n in started if not n.startswith("nbckpt-save-")]
    assert all(int(i) < kept.get(prefix, 0) for prefix, _, i in grown), grown
    assert len(set(grown)) == len(grown), grown


def test_pack_bytes_zero_keeps_every_leaf_an_array_orbax_can_read(tmp_path):
    step = _save(tmp_path, pack_bytes=0)
    names = {p.name for p in step.iterdir()}
    assert PACK_DIR not in names and "_METADATA" in names
    assert {"half", "count", "lr"} <= names and (step / "half" / ".zarray").is_file()
    assert PACK_KEY not in _sums(step)
    out = AsyncCheckpointer(tmp_path).restore(1)
    assert _same(out["half"], _state()["half"])


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1M"])
def test_a_bad_pack_bytes_is_refused_in_one_line(tmp_path, bad):
    with pytest.raises(ValueError, match="pack_bytes must be a non-negative int") as err:
        AsyncCheckpointer(tmp_path, pack_bytes=bad)
    assert "\n" not in str(err.value)


def _span(step: Path, leaf: str) -> tuple[int, int]:
    index: PackIndex = {}
    read_checksums(step, index)
    where = index[leaf]["0"]
    return where.offset, where.nbytes


def test_a_flipped_byte_in_a_pack_names_the_leaf_and_the_pack(tmp_path):
    step = _save(tmp_path)
    offset, _ = _span(step, "layers.3.bias")
    pack = step / PACK_DIR / "process_0"
    data = bytearray(pack.read_bytes())
    data[offset + 5] ^= 0x01
    pack.write_bytes(bytes(data))
    ck = AsyncCheckpointer(tmp_path)
    with pytest.raises(CorruptCheckpointError) as err:
        ck.restore(1)
    text = str(err.value)
    assert "leaf ['layers'][3]['bias']" in text and "chunk 0" in text and "checksum" in text
    assert str(pack) in text and f"bytes {offset}-" in text
    # The other leaves of the same pack still restore.
    out = ck.restore(1, target={"layers": [{"bias": ...}]}, partial=True)
    assert _same(out["layers"][0]["bias"], _state()["layers"][0]["bias"])  # type: ignore[index]
    problems = verify_step(step)
    assert len(problems) == 1 and problems[0].startswith("layers.3.bias: chunk 0")


@pytest.mark.parametrize("piece", [1 << 20, 100])  # 100: chunks span pieces
def test_packed_chunks_are_checksummed_as_they_are_read(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(chunkfiles, "SUM_PIECE", piece)
    step = _save(tmp_path)
    rechecked: list[int] = []
    real = checksum.matches
    monkeypatch.setattr(
        checksum, "matches", lambda d, a, e: rechecked.append(d.nbytes) or real(d, a, e)
    )
    want = _state()
    out = AsyncCheckpointer(tmp_path).restore(1, target=jax.tree.map(lambda x: x, want))
    for got, w in zip(out["layers"], want["layers"], strict=True):  # type: ignore[arg-type]
        assert _same(got["bias"], w["bias"]) and _same(got["scale"], w["scale"])
    assert _same(out["half"], want["half"]) and _same(out["big"], want["big"])
    assert rechecked == []  # every chunk came with its sum: none was read again
    # A damaged chunk's sum differs: the full check runs, and names it.
    offset, _ = _span(step, "layers.2.bias")
    pack = step / PACK_DIR / "process_0"
    data = bytearray(pack.read_bytes())
    data[offset] ^= 0x10
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"\['layers'\]\[2\]\['bias'\].*checksum"):
        AsyncCheckpointer(tmp_path).restore(1)
    assert len(rechecked) == 1


def test_a_missing_or_short_pack_is_damage_never_zeros(tmp_path):
    step = _save(tmp_path)
    pack = step / PACK_DIR / "process_0"
    offset, nbytes = _span(step, "layers.4.bias")
    pack.write_bytes(pack.read_bytes()[: offset + nbytes // 2])
    with pytest.raises(CorruptCheckpointError, match="is cut short"):
        AsyncCheckpointer(tmp_path).restore(1)
    pack.unlink()
    with pytest.raises(CorruptCheckpointError, match=r"its pack _PACKED/process_0 is missing"):
        AsyncCheckpointer(tmp_path).restore(1)
    assert any("is missing" in p for p in verify_step(step))


def test_a_pack_index_that_points_outside_the_step_is_refused(tmp_path):
    step = _save(tmp_path)
    sums = _sums(step)
    sums[PACK_KEY]["file"] = "../../etc/passwd"  # type: ignore[index]
    (step / CHECKSUMS_DIR / "process_0.json").write_text(json.dumps(sums))
    with pytest.raises(CorruptCheckpointError, match="entry is malformed"):
        AsyncCheckpointer(tmp_path).restore(1)


@pytest.mark.parametrize(
    ("part", "bad"),
    [
        ("span", [-64, 256]),  # a negative offset
        ("span", [0, "256"]),  # a size that is not a number
        ("span", [0, 256, 0]),  # three numbers
        ("span", {"offset": 0}),  # not a list
        ("sum", 2**32),  # past 32 bits
        ("sum", -1),
        ("sum", "deadbeef"),
    ],
)
def test_a_malformed_chunk_entry_is_refused_whichever_it_is(tmp_path, part, bad):
    """Each packed chunk's span and each recorded checksum is checked, one by one."""
    step = _save(tmp_path)
    sums = _sums(step)
    if part == "span":
        sums[PACK_KEY]["chunks"]["layers.2.bias"]["0"] = bad  # type: ignore[index]
    else:
        sums["layers.2.bias"]["0"] = bad  # type: ignore[index]
    (step / CHECKSUMS_DIR / "process_0.json").write_text(json.dumps(sums))
    with pytest.raises(ValueError, match="malformed"):
        read_checksums(step, {})
    with pytest.raises(CorruptCheckpointError, match="malformed"):
        AsyncCheckpointer(tmp_path).restore(1)


def test_a_local_units_files_name_its_pack_once(tmp_path):
    step = _save(tmp_path)
    files = unit_files(_sums(step))
    assert files.count(f"{PACK_DIR}/process_0") == 1
    assert all(not f.startswith(("layers", "half", "count", "lr")) for f in files)
    assert "big/0.0" in files


def test_neighbouring_ranges_are_read_with_one_request_of_bounded_size():
    gap, span = packed.COALESCE_GAP_BYTES, packed.SPAN_BYTES
    got = packed._coalesce([(100, 200), (0, 50), (200 + gap, 300 + gap), (60, 80)])
    assert got == [(0, 200), (200 + gap, 300 + gap)]
    mib = 1 << 20
    ranges = [(i * mib, (i + 1) * mib) for i in range(10)]
    got = packed._coalesce(ranges)
    assert got[0] == (0, span) and got[-1][1] == 10 * mib and all(b - a <= span for a, b in got)
    assert packed._coalesce([(0, 3 * span)]) == [(0, 3 * span)]  # one range is never cut


# -- several processes ----------------------------------------------------------------


def save_replicated(root: str) -> tuple[list[int], list[int]]:
    """Save 40 small replicated leaves from every process.

    Returns the bytes of each pack's chunks, and how many chunks of each leaf the packs
    hold.
    """

    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("d",))
    repl = NamedSharding(mesh, PartitionSpec())
    tree = {
        f"v{i:02d}": jax.device_put(np.arange(i + 1, dtype=np.float32), repl) for i in range(40)
    }
    ck = AsyncCheckpointer(root)
    ck.save(1, tree)
    ck.wait_until_finished()
    sums = [json.loads(p.read_text()) for p in (Path(root) / "1" / CHECKSUMS_DIR).iterdir()]
    index = [s[PACK_KEY]["chunks"] for s in sums if PACK_KEY in s]
    sizes = [sum(n for keys in i.values() for _, n in keys.values()) for i in index]
    return sorted(sizes), [sum(len(i.get(f"v{k:02d}", {})) for i in index) for k in range(40)]


def restore_replicated(root: str) -> bool:
    """Restore what :func:`save_replicated` saved; whether every value came back."""
    out = AsyncCheckpointer(root).restore(1)
    return all(np.array_equal(np.asarray(out[f"v{i:02d}"]), np.arange(i + 1)) for i in range(40))


@pytest.mark.multihost
def test_small_replicated_leaves_are_spread_over_the_processes(group4, group2, tmp_path):
    sizes, copies = group4.run(f"{T}:save_replicated", str(tmp_path))[0]
    assert len(sizes) == 4 and all(s > 0 for s in sizes)  # every process wrote some
    assert sum(sizes) == sum(4 * (i + 1) for i in range(40))  # each leaf once
    assert copies == [1] * 40
    assert group2.run(f"{T}:restore_replicated", str(tmp_path)) == [True, True]


def _advised() -> tuple[list[tuple[str, int, int, int]], object]:
    """Record each read-ahead hint given: (file, offset, length, advice); and the original.

    The hints still reach the system: the spy calls through.
    """
    calls: list[tuple[str, int, int, int]] = []
    advise = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))
        advise(fd, offset, length, advice)

    return calls, spy


def restore_hinted(root: str) -> dict[str, object]:
    """Restore what :func:`save_replicated` saved; the packs read ahead, and if it came back."""
    original = os.posix_fadvise
    calls, spy = _advised()
    os.posix_fadvise = spy  # type: ignore[assignment]
    try:
        same = restore_replicated(root)  # the hint is given before it returns
    finally:
        os.posix_fadvise = original
    return {"same": same, "hinted": [os.path.basename(c[0]) for c in calls]}


@pytest.mark.multihost
def test_each_process_reads_its_own_pack_ahead_only_if_as_many_restore(group4, group2, tmp_path):
    group4.run(f"{T}:save_replicated", str(tmp_path))
    got = group4.run(f"{T}:restore_hinted", str(tmp_path))
    assert got == [{"same": True, "hinted": [f"process_{i}"]} for i in range(4)]
    # Two processes restoring the step of four would each read ahead what it may not read.
    assert group2.run(f"{T}:restore_hinted", str(tmp_path)) == [{"same": True, "hinted": []}] * 2


def test_a_restore_reads_the_head_of_its_pack_ahead_a_partial_one_does_not(tmp_path, monkeypatch):
    step = _save(tmp_path)
    calls, spy = _advised()
    monkeypatch.setattr(os, "posix_fadvise", spy)
    ck = AsyncCheckpointer(tmp_path)
    out = ck.restore(1)  # the hint is given before it returns
    pack = os.path.realpath(step / PACK_DIR / "process_0")
    assert calls == [(pack, 0, packed.READ_AHEAD_BYTES, os.POSIX_FADV_WILLNEED)]
    assert _same(out["big"], _state()["big"])
    calls.clear()
    one = ck.restore(1, target={"layers": [{}, {}, {"bias": ...}]}, partial=True)
    assert calls == []  # a partial restore may need little of the pack
    assert _same(one["layers"][2]["bias"], _state()["layers"][2]["bias"])  # type: ignore[index]
    # A pack gone is the restore's to report, not the hint's.
    (step / PACK_DIR / "process_0").unlink()
    with pytest.raises(CorruptCheckpointError, match="process_0 is missing"):
        ck.restore(1)
    assert calls == []


def test_the_pack_is_read_ahead_before_the_checksums_are_in(tmp_path, monkeypatch):
    # The hint goes out once the metadata says the pack is this process's to read,
    # while the checksums files are still being read and parsed: not after.
    step = _save(tmp_path)
    calls, spy = _advised()
    hinted = threading.Event()

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        spy(fd, offset, length, advice)  # type: ignore[operator]
        hinted.set()

    monkeypatch.setattr(os, "posix_fadvise", advise)
    recorded = restore_step._recorded
    hinted_first: list[bool] = []

    def held_sums(directory: object, packs: PackIndex) -> object:
        # Not in until the hint is given: a restore that waited for them to hint
        # would hint only after this gave up.
        hinted_first.append(hinted.wait(timeout=30))
        return recorded(directory, packs)  # type: ignore[arg-type]

    monkeypatch.setattr(restore_step, "_recorded", held_sums)
    out = AsyncCheckpointer(tmp_path).restore(1)
    assert _same(out["big"], _state()["big"])
    assert hinted_first == [True]
    pack = os.path.realpath(step / PACK_DIR / "process_0")
    assert calls == [(pack, 0, packed.READ_AHEAD_BYTES, os.POSIX_FADV_WILLNEED)]


def test_the_inventory_takes_a_packed_step_for_complete_until_its_packs_go(tmp_path):
    import shutil

    from nbckpt.formats.inventory import classify

    step = _save(tmp_path)
    assert [(e.step, e.state) for e in classify(tmp_path)] == [(1, "complete")]
    shutil.rmtree(step / PACK_DIR)
    (entry,) = classify(tmp_path)
    assert entry.state == "corrupt" and PACK_DIR in entry.reason


def test_a_leaf_cannot_take_the_packs_folder_name():
    from nbckpt.engine.arrays.tree import flatten

    with pytest.raises(ValueError, match=r"_packed.*its own records") as err:
        flatten({"_packed": np.zeros(3)})  # case folded: one folder on a case-blind disk
    assert "\n" not in str(err.value)


def reshard_packed(root: str) -> list[str]:
    """Save a small leaf in 2-row chunks by rows; restore it by columns, checked or not.

    Each device's columns cut every chunk: the restore takes the chunks it touches
    from the pack and copies out their intersection. Returns what went wrong.
    """
    import functools

    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from nbckpt.engine.arrays.zarr import chunk_shape
    from nbckpt.engine.restore.step import restore_step
    from nbckpt.engine.save import leafplan

    mesh = Mesh(np.array(jax.devices()), ("x",))
    value = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    leafplan.chunk_shape = functools.partial(chunk_shape, max_bytes=48)
    leafplan._PLANS.clear()
    try:
        ck = AsyncCheckpointer(root)
        ck.save(1, {"v": jax.device_put(value, NamedSharding(mesh, P("x", None)))})
        ck.wait_until_finished()
    finally:
        leafplan.chunk_shape = chunk_shape
        leafplan._PLANS.clear()
    problems = []
    if not (Path(root) / "1" / PACK_DIR).is_dir():
        problems.append("not packed")
    cols = NamedSharding(mesh, P(None, "x"))
    for verify in (True, False):
        out = restore_step(Path(root) / "1", {"v": cols}, verify=verify)
        for shard in out["v"].addressable_shards:
            if not np.array_equal(np.asarray(shard.data), value[shard.index]):
                problems.append(f"verify={verify}: {shard.index} differs")
    return problems


@pytest.mark.multihost
def test_a_target_that_cuts_packed_chunks_gets_their_intersection(group1, tmp_path):
    assert group1.run(f"{T}:reshard_packed", str(tmp_path)) == [[]]


def small_shards_packed(root: str) -> dict[str, object]:
    """Save two leaves over 8 devices, with shards of 1 KiB and 4 KiB, pack_bytes 2 KiB.

    Returns which leaves are packed, and whether a restore into column shardings (other
    shards than were saved) gives back the values.
    """
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows, cols = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "x"))
    values = {
        "fine": np.arange(64 * 32, dtype=np.float32).reshape(64, 32),  # 8 KiB, 1 KiB shards
        "coarse": np.arange(256 * 32, dtype=np.float32).reshape(256, 32),  # 4 KiB shards
    }
    ck = AsyncCheckpointer(root)
    ck.save(1, {k: jax.device_put(v, rows) for k, v in values.items()}, pack_bytes=2048)
    ck.wait_until_finished()
    meta = json.loads((Path(root) / "1" / "_NBCKPT_METADATA").read_text())
    out = ck.restore(1, target={k: cols for k in values})
    same = all(
        np.array_equal(np.asarray(s.data), values[k][s.index])
        for k in values
        for s in out[k].addressable_shards
    )
    return {"packed": sorted(m["name"] for m in meta["leaves"] if m.get("packed")), "same": same}


@pytest.mark.multihost
def test_a_leaf_is_packed_by_its_shards_not_its_whole_size(group4, tmp_path):
    """A large matrix cut into small shards costs a file per shard: it is packed too."""
    got = group4.run(f"{T}:small_shards_packed", str(tmp_path))
    assert got == [{"packed": ["fine"], "same": True}] * 4


# -- small leaves read in bulk --------------------------------------------------------


def _spying(taken: list[str]) -> object:
    """``BulkReads.add``, recording in ``taken`` the name of each leaf it takes."""
    from nbckpt.engine.restore.bulk import BulkReads

    add = BulkReads.add

    def spy(self: BulkReads, meta: dict[str, object], *args: object, **kw: object) -> object:
        leaf = add(self, meta, *args, **kw)  # type: ignore[arg-type]
        if leaf is not None:
            taken.append(str(meta["name"]))
        return leaf

    return spy


def _taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the names of the leaves each restore reads in bulk."""
    from nbckpt.engine.restore.bulk import BulkReads

    taken: list[str] = []
    monkeypatch.setattr(BulkReads, "add", _spying(taken))
    return taken


def test_small_packed_leaves_are_read_in_bulk_and_converted_ones_as_before(tmp_path, monkeypatch):
    _save(tmp_path)
    taken = _taken(monkeypatch)
    ck = AsyncCheckpointer(tmp_path)
    want = _state()
    out = ck.restore(1, target=jax.tree.map(lambda x: x, want))
    small = {f"layers.{i}.{k}" for i in range(5) for k in ("bias", "scale")} | {"half", "count"}
    assert small <= set(taken) and "big" not in taken
    assert _same(out["layers"][3]["bias"], want["layers"][3]["bias"])  # type: ignore[index]
    assert _same(out["half"], want["half"]) and int(out["count"]) == 7
    # A leaf converted on the way (cast=True) takes the general path, and is converted.
    taken.clear()
    target = jax.tree.map(lambda x: x, want)
    bias = want["layers"][1]["bias"]  # type: ignore[index]
    target["layers"][1]["bias"] = jax.ShapeDtypeStruct(
        bias.shape, jax.numpy.float16, sharding=bias.sharding
    )  # type: ignore[index]
    out = ck.restore(1, target=target, cast=True)
    assert "layers.1.bias" not in taken and "layers.2.bias" in taken
    got = out["layers"][1]["bias"]  # type: ignore[index]
    assert got.dtype == jax.numpy.float16
    assert np.array_equal(np.asarray(got), np.asarray(bias).astype(np.float16))


def test_leaves_read_in_bulk_as_host_values_are_arrays_of_their_own(tmp_path, monkeypatch):
    _save(tmp_path)
    taken = _taken(monkeypatch)
    out = AsyncCheckpointer(tmp_path).restore(
        1, target={"layers": [{"bias": ...}] * 5}, partial=True
    )
    assert len(taken) == 5
    first, second = out["layers"][0]["bias"], out["layers"][1]["bias"]
    assert isinstance(first, np.ndarray) and first.flags.owndata and first.flags.writeable
    first[:] = 0  # changing one restored value changes no other
    assert _same(second, _state()["layers"][1]["bias"])  # type: ignore[index]


def sharded_small_leaves(root: str) -> dict[str, object]:
    """Save small leaves, some split over this process's devices; restore them.

    Returns where the pack put whole leaves and shards, the leaves read in bulk, and
    what came back different.
    """
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from nbckpt.engine.restore.bulk import BulkReads

    mesh = Mesh(np.array(jax.devices()), ("x",))
    split, repl = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    values = {f"v{i}": np.arange(16 * (i + 1), dtype=np.float32) + i for i in range(6)}
    tree = {
        k: jax.device_put(v, split if i % 2 else repl) for i, (k, v) in enumerate(values.items())
    }
    ck = AsyncCheckpointer(root)
    ck.save(1, tree)
    ck.wait_until_finished()
    index: PackIndex = {}
    read_checksums(Path(root) / "1", index)
    whole = [
        w.offset
        for name in index
        for key, w in index[name].items()
        if key == "0" and len(index[name]) == 1
    ]
    shards = [w.offset for name in index for w in index[name].values() if len(index[name]) > 1]
    taken: list[str] = []
    add = BulkReads.add
    BulkReads.add = _spying(taken)  # type: ignore[method-assign]
    try:
        out = ck.restore(1, target=tree)
    finally:
        BulkReads.add = add  # type: ignore[method-assign]
    differ = [
        k for k, v in values.items() if not _same(out[k], v) or out[k].sharding != tree[k].sharding
    ]
    return {
        "whole_last": max(whole),
        "shards_first": min(shards),
        "taken": sorted(taken),
        "differ": differ,
    }


@pytest.mark.multihost
def test_shards_of_small_leaves_follow_whole_ones_and_all_are_read_in_bulk(group1, tmp_path):
    (got,) = group1.run(f"{T}:sharded_small_leaves", str(tmp_path))
    # Every process reads the whole leaves, only one each shard: they come first.
    assert got["whole_last"] < got["shards_first"]
    assert got["taken"] == [f"v{i}" for i in range(6)] and got["differ"] == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 1 << 24), st.integers(0, 1 << 21)),
        min_size=1,
        max_size=60,
        unique_by=lambda c: (c[0], c[1]),
    )
)
def test_stretches_hold_every_chunk_once_within_their_bounds(chunks):
    from nbckpt.engine.restore import bulk
    from nbckpt.formats.packs import PackedChunk

    parts = [
        (None, bulk.BulkChunk(str(i), PackedChunk(f, o, n), (n,), None))
        for i, (f, o, n) in enumerate(chunks)
    ]
    seen = []
    stretches = bulk._stretches(parts)  # type: ignore[arg-type]
    for k, (file, start, stop, group) in enumerate(stretches):
        ends = [c.where.offset + c.where.nbytes for _, c in group]
        assert all(c.where.file == file for _, c in group)
        assert start == min(c.where.offset for _, c in group) and stop == max(ends)
        # The first is short, so that its leaves are placed soon; each next one may be
        # twice as long, up to STRETCH_BYTES.
        bound = min(bulk.FIRST_STRETCH_BYTES << k, bulk.STRETCH_BYTES)
        assert stop - start <= bound or len(group) == 1
        seen += [c.key for _, c in group]
    assert sorted(seen) == sorted(str(i) for i in range(len(chunks)))
