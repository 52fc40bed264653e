"""Real JAX processes joined by jax.distributed on 127.0.0.1, writing real files."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
import pytest

from nbckpt.engine.restore import hostshare
from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE, all_steps, latest_step
from nbckpt.journal import read_operation

pytestmark = pytest.mark.multihost
T = "tests.mh_tasks"


@pytest.fixture(autouse=True)
def _clear_hooks(request):
    yield
    for name in ("group4", "group2", "group1"):
        if name in request.fixturenames:
            request.getfixturevalue(name).run(f"{T}:clear_hooks")


@pytest.fixture(scope="module")
def saved4(group4, tmp_path_factory):
    """A root where four processes saved steps 1 and 2 in a row (the second save waits
    for the first)."""
    root = str(tmp_path_factory.mktemp("saved4"))
    first = group4.run(f"{T}:save", root, 1, kwargs={"wait": False})
    second = group4.run(f"{T}:save", root, 2)
    return {"root": root, "ops": [first[0]["op"], second[0]["op"]]}


def test_processes_are_joined(group4, group2):
    info = group4.run(f"{T}:info")
    assert [i["process"] for i in info] == [0, 1, 2, 3]
    assert {i["count"] for i in info} == {4} and {i["devices"] for i in info} == {8}
    assert {i["count"] for i in group2.run(f"{T}:info")} == {2}


def test_two_saves_in_a_row_restore_bit_identical(group4, saved4):
    root = saved4["root"]
    assert all_steps(root) == [1, 2]
    assert group4.run(f"{T}:restore_check", root, 1, 1) == [[]] * 4
    assert group4.run(f"{T}:restore_check", root, None, 2) == [[]] * 4  # latest


def test_restore_without_target_rebuilds_the_saved_mesh(group4, saved4):
    assert (
        group4.run(f"{T}:restore_check", saved4["root"], 2, 2, kwargs={"use_target": False})
        == [[]] * 4
    )


def test_partial_restore(group4, saved4):
    assert (
        group4.run(f"{T}:restore_check", saved4["root"], 2, 2, kwargs={"subset": True}) == [[]] * 4
    )


def test_restore_into_fewer_processes(group2, group1, saved4):
    root = saved4["root"]
    # 2 processes x 1 device, and 1 process x 2 devices: other meshes than at save time.
    assert group2.run(f"{T}:restore_check", root, 2, 2) == [[]] * 2
    assert group1.run(f"{T}:restore_check", root, 1, 1) == [[]]
    assert group2.run(f"{T}:restore_check", root, 1, 1, kwargs={"use_target": False}) == [[]] * 2


def test_journal_holds_every_phase_of_every_process(saved4):
    rec = read_operation(saved4["root"], saved4["ops"][1])
    assert rec.status == "committed" and rec.process_count == 4
    assert sorted(rec.processes) == [0, 1, 2, 3]
    common = [
        "snapshot",
        "barrier:tmp_ready",
        "write",
        "barrier:write_complete",
        "barrier:commit_complete",
    ]
    for p, proc in rec.processes.items():
        names = [s.name for s in proc.phases]
        expected = [*common[:4], "finalize", *common[4:]] if p == 0 else common
        assert names == expected, (p, names)
        assert all(s.end is not None and s.end >= s.start for s in proc.phases)
        assert proc.status == "committed"


def test_each_shard_is_written_exactly_once(saved4):
    root = saved4["root"]
    with open(f"{root}/2/{METADATA_FILE}") as f:
        meta = json.load(f)
    global_bytes = sum(
        math.prod(m["shape"]) * np.dtype(m["dtype"]).itemsize
        for m in meta["leaves"]
        if "chunks" in m  # every stored array, Python numbers' 0-d ones included
    )
    rec = read_operation(root, saved4["ops"][1])
    written = sum(p.bytes_written for p in rec.processes.values())
    # Replicated leaves ("b" on every device, "mu" across the model axis) would push
    # the sum above the global size if any replica were written twice.
    assert written == global_bytes
    assert all(p.bytes_written > 0 for p in rec.processes.values())


def test_commit_file_mode(group4, tmp_path):
    root = str(tmp_path)
    group4.run(f"{T}:save", root, 3, kwargs={"mode": "commit_file"})
    assert (tmp_path / "3" / COMMIT_FILE).is_file()
    assert not (tmp_path / "3.nbckpt-tmp").exists()
    assert all_steps(root) == [3]
    assert group4.run(f"{T}:restore_check", root, 3, 3) == [[]] * 4


def test_barrier_timeout_names_the_missing_process(group4):
    res = group4.run(f"{T}:barrier_skip", "skiptest", 3, 1.0)
    assert res[3] == "skipped"
    for r in res[:3]:
        assert r.startswith("BarrierTimeoutError") and "process 3 did not arrive" in r


def test_barrier_meets_at_the_service_then_waits_over_the_store(group4):
    # Arrivals within a second meet at the service's own barrier (one round trip, no
    # key-value count); a process later than that finds it over and everyone meets
    # over the key-value store, where a wait can notice failures.
    res = group4.run(f"{T}:barrier_paths", "pathtest", 2, 2.5)
    assert res == [["None", "4"]] * 4


def test_subset_barrier(group4):
    res = group4.run(f"{T}:barrier_subset", "subsettest", [0, 2])
    assert res == ["passed", "not a participant", "passed", "not a participant"]


def test_latest_step_never_returns_a_temporary_directory(group4, tmp_path):
    root = str(tmp_path)
    group4.run(f"{T}:save", root, 1)
    group4.run(f"{T}:stall_everywhere", "finalize", 2.0)
    group4.run(f"{T}:save", root, 2, kwargs={"wait": False})
    deadline = time.monotonic() + 30
    while not (tmp_path / "2.nbckpt-tmp").is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "2.nbckpt-tmp").is_dir()
    assert latest_step(root) == 1 and all_steps(root) == [1]
    assert group4.run(f"{T}:wait", root) == [None] * 4
    assert latest_step(root) == 2


def test_a_stalled_process_fails_the_save_and_is_named(group4, tmp_path):
    root = str(tmp_path)
    opts = {"timeout_s": 1.0}
    group4.run(f"{T}:save", root, 1, kwargs=opts)
    group4.run(f"{T}:stall_at", "barrier:write_complete", 3, 3.0)
    group4.run(f"{T}:save", root, 2, kwargs={"wait": False, **opts})
    errors = group4.run(f"{T}:wait", root, kwargs=opts)
    assert all(e is not None and "process 3" in e for e in errors), errors
    assert all_steps(root) == [1]  # nothing half-written is taken for complete
    assert group4.run(f"{T}:restore_check", root, None, 1) == [[]] * 4


def _scratch_files() -> set[Path]:
    return set(hostshare.SCRATCH_DIR.glob(f"nbckpt-{os.getuid()}-*"))


def test_replicated_leaves_are_written_and_read_once_per_job(group4, tmp_path):
    """Every process writes its part of a replicated leaf, then reads and checks only
    its slab into the host's shared memory, and adopts the whole leaf from there."""
    before = _scratch_files()
    out = group4.run(f"{T}:replicated_round_trip", str(tmp_path), "share")
    assert [o["problems"] for o in out] == [[]] * 4
    unique = (8 << 20) + (16 << 20) + 32  # rep, half, tiny: each stored once
    written = [o["save"]["write_done"] for o in out]
    assert sum(written) == unique
    # rep (8 replicas) and half (4 replicas) are split among the devices holding them:
    # no process writes more than its share plus the tiny leaf.
    assert max(written) <= unique // 4 + 32
    # Each byte of rep and half is read by one process of the host (tiny, too small
    # to split, by all four), and every chunk read is checked.
    read = [o["restore"]["read_done"] for o in out]
    assert sum(read) == unique - 32 + 4 * 32, read
    assert {o["restore"]["verified"] for o in out} == {1}
    assert _scratch_files() == before  # every shared file is unlinked


def test_replicated_leaves_are_read_whole_where_memory_is_not_shared(group4, tmp_path):
    """Processes that share a host name but not its shared memory find the other
    slabs missing after the barrier and read the whole leaf themselves."""
    out = group4.run(f"{T}:replicated_round_trip", str(tmp_path), "apart")
    assert [o["problems"] for o in out] == [[]] * 4
    read = [o["restore"]["read_done"] for o in out]
    # Each read its slab first, then the whole of rep and half's two shards.
    assert all(r >= (8 << 20) + (16 << 20) + 32 for r in read), read
    assert sum(read) == 4 * ((8 << 20) + (16 << 20) + 32) + (8 << 20) + (16 << 20), read
    assert not [p for i in range(4) for p in (tmp_path / f"shm-{i}").iterdir()]


def test_replicated_leaves_can_be_read_in_pieces_and_gathered(group4, tmp_path):
    """Across hosts or on an object store, each device reads a piece; XLA gathers them."""
    out = group4.run(f"{T}:replicated_round_trip", str(tmp_path), "split")
    assert [o["problems"] for o in out] == [[]] * 4


def test_a_damaged_replicated_chunk_fails_the_restore_everywhere(group4, tmp_path):
    """One process checks the damaged chunk; all four fail, none returns bad data."""
    root = str(tmp_path)
    out = group4.run(f"{T}:replicated_round_trip", root, "share")
    assert [o["problems"] for o in out] == [[]] * 4
    chunks = sorted((tmp_path / "1" / "rep").glob("[0-9]*"))
    assert len(chunks) > 1  # split among the replicas at save time
    damaged = chunks[-1]
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    before = _scratch_files()
    errors = group4.run(f"{T}:restore_error", root, 1)
    assert all(errors), errors
    assert _scratch_files() == before  # a failed restore leaves no shared file behind
    kinds = [e.split(":", 1)[0] for e in errors]
    assert kinds.count("CorruptCheckpointError") >= 1, errors
    assert set(kinds) <= {"CorruptCheckpointError", "PeerFailedError"}, errors
