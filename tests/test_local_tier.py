"""The local tier (issue 28): every save to each host's directory and its peers' replicas,
and a restore from the fastest tier that holds a step whole.

The multihost tests run real processes joined by ``jax.distributed``; each process is
given its own local directory, so each is a host of its own (a host is what shares a
local directory). A lost host is its directory wiped: a new process there gets a new
host id and none of the old copies.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from nbckpt import storage
from nbckpt.engine.tiers.options import TierOptions, root_key
from nbckpt.engine.tiers.recover import choose
from nbckpt.engine.tiers.units import held_processes
from nbckpt.formats.layout import all_steps, is_complete
from nbckpt.journal import read_operation
from nbckpt.procgroup import ProcessGroup
from nbckpt.protocol import Tier
from nbckpt.views.answers import op_label
from nbckpt.views.monitor import view_state
from tests.s3server import S3Server

T = "tests.mh_local_tier"


def _local(directory: str, root: str) -> Path:
    return Path(directory) / "nbckpt" / root_key(Path(root))


def _post(host: str, holdings: dict[int, tuple[int, list[int]]]) -> dict[str, Any]:
    held = {str(s): {"processes": n, "held": units} for s, (n, units) in holdings.items()}
    return {"host": host, "peer": "127.0.0.1:1", "holdings": held}


# -- the choice: pure, every process computes the same -------------------------------


def test_the_newest_step_the_live_hosts_hold_whole_is_chosen() -> None:
    extras = {
        0: _post("a", {4: (3, [0, 2]), 5: (3, [0])}),
        1: _post("b", {4: (3, [1]), 5: (3, [1])}),
        2: _post("b", {4: (3, [1]), 5: (3, [1])}),  # the same host again: counted once
    }
    # Step 5 lacks process 2's shards on every live host: step 4 is the newest whole one.
    got = choose(extras, persistent=2, wanted=None)
    assert (got.step, got.tier) == (4, Tier.LOCAL)
    assert got.holders == {"a": [0, 2], "b": [1]}
    assert "hold only part of step(s) [5]" in got.why
    assert "the root's newest is 2" in got.why


def test_a_newer_persistent_step_wins_and_nothing_anywhere_is_none() -> None:
    extras = {0: _post("a", {3: (1, [0])})}
    assert choose(extras, persistent=6, wanted=None).step == 6
    assert choose(extras, persistent=6, wanted=None).tier == Tier.PERSISTENT
    assert choose({0: _post("a", {})}, persistent=None, wanted=None).step is None


def test_a_step_asked_for_comes_locally_only_when_held_whole() -> None:
    extras = {0: _post("a", {3: (2, [0])}), 1: _post("b", {3: (2, [1]), 4: (2, [1])})}
    assert choose(extras, persistent=None, wanted=3).tier == Tier.LOCAL
    assert choose(extras, persistent=4, wanted=4).tier == Tier.PERSISTENT
    none = choose(extras, persistent=None, wanted=4)
    assert none.step is None and "hold only part of step(s) [4]" in none.why


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("local_replicas", -1, "local_replicas must be an int of at least 0"),
        ("persistent_every", 0, "persistent_every must be an int of at least 1"),
        ("local_keep", True, "local_keep must be an int of at least 1"),
        ("local_dir", " ", "local_dir must be a directory"),
    ],
)
def test_bad_tier_options_are_refused_in_one_line(field: str, value: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TierOptions(**{field: value})


def test_every_mth_step_goes_to_the_root_and_all_without_a_local_dir() -> None:
    tiers = TierOptions(local_dir="/tmp/x", persistent_every=3)
    assert [s for s in range(7) if tiers.persistent(s)] == [0, 3, 6]
    assert all(TierOptions(persistent_every=3).persistent(s) for s in range(7))


def test_a_tier_that_opens_removes_only_stale_scratch_of_its_own(tmp_path: Path) -> None:
    import os

    from nbckpt.engine.tiers.local import STALE_SCRATCH_S, LocalTier

    local = _local(str(tmp_path / "host"), str(tmp_path / "root"))
    local.mkdir(parents=True)
    old = time.time() - STALE_SCRATCH_S - 60
    for name in (".incoming-dead", ".restore-dead", ".restore-live", "mine-not"):
        (local / name).mkdir()
        (local / name / "f").write_text("x")
    for name in (".incoming-dead", ".restore-dead", "mine-not"):
        os.utime(local / name, (old, old))
    LocalTier(TierOptions(local_dir=str(tmp_path / "host")), Path(tmp_path / "root"))
    assert sorted(p.name for p in local.iterdir()) == [".restore-live", "mine-not"]


# -- real processes ------------------------------------------------------------------


def _save(root: str, dirs: list[str], steps: list[int], **kw: Any) -> list[Any]:
    with ProcessGroup(4) as group:
        return group.run(f"{T}:save", root, dirs, steps, kwargs=kw, timeout_s=240)


def _restore(root: str, dirs: list[str], **kw: Any) -> list[dict[str, Any]]:
    with ProcessGroup(len(dirs)) as group:
        return group.run(f"{T}:restore", root, dirs, kwargs=kw, timeout_s=240)


def _label(root: str, op: str) -> str:
    rec = read_operation(root, op)
    return op_label(rec.kind, rec.step, rec.name, rec.preemption, rec.tier)


def _fetched_from(result: dict[str, Any]) -> set[int]:
    return {p for e in result["events"] if e["event"] == "fetched" for p in e["processes"]}


@pytest.mark.multihost
def test_a_wiped_host_gets_the_newest_local_step_from_its_peers(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    saved = _save(root, dirs, [0, 1, 2, 3], persistent_every=2, local_replicas=1, pack_bytes=0)
    assert all_steps(root) == [0, 2]  # 1 and 3 live only in the local tier
    labels = [_label(root, op) for op in saved[0]["ops"]]
    assert labels[2:] == ["save 2 (local tier + root)", "save 3 (local tier only)"]
    for d in dirs:
        assert all_steps(_local(d, root)) == [2, 3]  # each host keeps its newest 2
    shutil.rmtree(dirs[2])  # host 2 is lost: a replacement starts empty

    results = _restore(root, dirs)
    assert [r["step"] for r in results] == [3] * 4
    assert all(r["same"] for r in results)  # bit for bit, on every process
    chosen = [e for e in results[0]["events"] if e["event"] == "tier_chosen"]
    assert chosen[0]["tier"] == "local"
    # The replacement got its own shards (process 2's) from the host that kept its
    # replica, and the replicated vector's (process 0's) from a peer.
    assert _fetched_from(results[2]) == {0, 2}
    assert is_complete(_local(dirs[2], root) / "3")
    # Its own shards went back into its host's copy, whole; of process 0's, only the
    # replicated vector's chunk was fetched, into a staging copy removed after.
    whole = {e["processes"][0]: e["whole"] for e in results[2]["events"] if e["event"] == "fetched"}
    assert whole == {2: True, 0: False}
    assert 2 in held_processes(_local(dirs[2], root) / "3")
    assert not [p for d in dirs for p in _local(d, root).iterdir() if p.name.startswith(".")]
    # The views say where the restore read from, and each process where its shards came.
    assert _label(root, results[0]["op"]) == "restore 3 (from the hosts' local copies)"
    assert results[0]["op"].endswith("-restore-3")  # named for the step it read
    notes = {
        v.process: v.note for v in view_state(read_operation(root, results[0]["op"])).processes
    }
    assert notes[0] == notes[1] == "read its host's local copy"
    assert notes[2].startswith("read its host's local copy, and from peers: ")
    assert "process 2's shards" in notes[2] and "process 0's shards (20 B)" in notes[2]


@pytest.mark.multihost
def test_a_wiped_host_gets_the_packs_of_small_leaves_from_its_peers(tmp_path: Path) -> None:
    """Every leaf here is small, so packed: the replacement needs every peer's pack."""
    root = str(tmp_path / "root")
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    _save(root, dirs, [0, 1], persistent_every=2, local_replicas=1)
    assert all((_local(d, root) / "1" / "_PACKED").is_dir() for d in dirs)
    shutil.rmtree(dirs[2])
    results = _restore(root, dirs)
    assert [r["step"] for r in results] == [1] * 4 and all(r["same"] for r in results)
    assert _fetched_from(results[2]) == {0, 1, 2, 3}  # the sharded w lies in every pack
    whole = {e["processes"][0]: e["whole"] for e in results[2]["events"] if e["event"] == "fetched"}
    assert whole[2] is True  # its own unit, pack included, back in its host's copy
    assert (_local(dirs[2], root) / "1" / "_PACKED" / "process_2").is_file()
    assert not [p for d in dirs for p in _local(d, root).iterdir() if p.name.startswith(".")]


@pytest.mark.multihost
def test_two_adjacent_hosts_lost_with_one_replica_fall_back_to_the_root(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    _save(root, dirs, [0, 1, 2, 3], persistent_every=2, local_replicas=1)
    shutil.rmtree(dirs[1])
    shutil.rmtree(dirs[2])  # process 1's shards were on hosts 1 and 2 only

    results = _restore(root, dirs)
    assert [r["step"] for r in results] == [2] * 4
    assert all(r["same"] for r in results)
    chosen = next(e for e in results[0]["events"] if e["event"] == "tier_chosen")
    assert chosen["tier"] == "persistent"
    assert "hold only part of step(s) [2, 3]" in chosen["why"]


@pytest.mark.multihost
def test_two_processes_restore_what_four_hosts_saved(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    _save(root, dirs, [0, 1], persistent_every=5, local_replicas=1, pack_bytes=0)
    # Hosts 0 and 2 hold units {0, 3} and {2, 1} of step 1: whole between them.
    results = _restore(root, [dirs[0], dirs[2]])
    assert [r["step"] for r in results] == [1, 1]
    assert all(r["same"] for r in results)
    assert _fetched_from(results[0]) == {1}  # rows 0-127 are processes 0 and 1's


@pytest.mark.multihost
@pytest.mark.parametrize(
    ("phase", "restored"),
    [
        # No host committed step 3: the newest step is 2, whole on every host.
        ("local_write", 2),
        # Every host committed its own copy of 3 before process 3 died.
        ("replicate", 3),
    ],
)
def test_a_process_killed_in_the_local_save_never_leaves_a_torn_step(
    tmp_path: Path, phase: str, restored: int
) -> None:
    root = str(tmp_path / "root")
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    with ProcessGroup(4, recoverable=True) as group:
        group.submit(
            f"{T}:save",
            root,
            dirs,
            [0, 1, 2, 3],
            kwargs={"fault": (3, phase, 3), "persistent_every": 2},
        )
        outcomes = group.outcomes(timeout_s=240)
    assert outcomes[3][0] is False  # the victim
    for ok, result in outcomes[:3]:
        assert ok and "process 3 died" in str(result["error"]), result
    if phase == "local_write":
        assert not any((_local(d, root) / "3").exists() for d in dirs)
    results = _restore(root, dirs)
    assert [r["step"] for r in results] == [restored] * 4
    assert all(r["same"] for r in results)


@pytest.mark.multihost
def test_an_s3_root_takes_every_mth_step_and_a_wiped_host_recovers_locally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = [str(tmp_path / f"host{i}") for i in range(4)]
    with S3Server() as s3:
        s3.create_bucket("tiers")
        root, env = "s3://tiers/run", s3.env()
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        _save(root, dirs, [0, 1, 2], persistent_every=2, env=env, pack_bytes=0)
        assert all_steps(storage.location(root)) == [0, 2]
        _save(root, dirs, [3], persistent_every=2, env=env, pack_bytes=0)
        shutil.rmtree(dirs[0])  # the host of process 0, the primary
        results = _restore(root, dirs, env=env)
        assert [r["step"] for r in results] == [3] * 4
        assert all(r["same"] for r in results)
        assert _fetched_from(results[0]) == {0}  # its own shards, from its replica
        fetched = [e for e in results[0]["events"] if e["event"] == "fetched"]
        assert [e["whole"] for e in fetched] == [True]  # back in its host's copy
