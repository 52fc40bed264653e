"""Misuse must never cost a committed step: real processes, real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.errors import CommitRefusedError, ForeignEntryError, StepExistsError
from nbckpt.formats.fsck import fsck
from nbckpt.formats.inventory import classify
from nbckpt.formats.layout import METADATA_FILE, all_steps, entry_state, parse_step, read_metadata
from nbckpt.protocol import PHASES

T = "tests.mh_tasks"


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((8, 4)).astype(np.float32), "n": np.arange(3) + seed}


def _save(root: Path, step: int, seed: int, **kw: object) -> None:
    with AsyncCheckpointer(root) as ckptr:
        ckptr.save(step, _state(seed), **kw)  # type: ignore[arg-type]


def _restored(root: Path, step: int) -> dict[str, np.ndarray]:
    with AsyncCheckpointer(root) as ckptr:
        return ckptr.restore(step)  # type: ignore[no-any-return]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), b[k]) for k in b)


def test_forced_resave_in_commit_file_mode_is_refused_and_keeps_the_step(tmp_path: Path) -> None:
    _save(tmp_path, 3, seed=1, mode="commit_file")
    before = sorted(p.name for p in (tmp_path / "3").rglob("*"))
    with pytest.raises(CommitRefusedError, match="use mode='rename'"):
        _save(tmp_path, 3, seed=2, mode="commit_file", force=True)
    assert sorted(p.name for p in (tmp_path / "3").rglob("*")) == before
    assert _same(_restored(tmp_path, 3), _state(1))


def test_forced_resave_in_rename_mode_replaces_a_commit_file_step(tmp_path: Path) -> None:
    _save(tmp_path, 3, seed=1, mode="commit_file")
    _save(tmp_path, 3, seed=2, mode="rename", force=True)
    assert _same(_restored(tmp_path, 3), _state(2))
    assert all_steps(tmp_path) == [3]
    assert [e.path for e in classify(tmp_path)] == ["3"]


def test_truncated_metadata_of_a_committed_step_is_corrupt_and_never_cleaned(
    tmp_path: Path,
) -> None:
    for mode in ("rename", "commit_file"):
        root = tmp_path / mode
        _save(root, 5, seed=1, mode=mode)
        meta = root / "5" / METADATA_FILE
        meta.write_text(meta.read_text()[:40])
        assert entry_state(root / "5") == "corrupt"
        report = fsck(root, clean=True, stale_after_s=0)
        assert [(e.path, e.state) for e in report.entries] == [("5", "corrupt")]
        assert report.removed == []
        assert (root / "5").is_dir()


@pytest.mark.parametrize("mode", ["rename", "commit_file"])
def test_foreign_step_directory_is_never_written_or_cleaned(tmp_path: Path, mode: str) -> None:
    user = tmp_path / "8"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    (tmp_path / "7").mkdir()
    for force in (False, True):
        with pytest.raises(ForeignEntryError, match="not created by nbckpt"):
            _save(tmp_path, 8, seed=1, mode=mode, force=force)
    assert (user / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    report = fsck(tmp_path, clean=True, stale_after_s=0)
    assert {e.path: e.state for e in report.entries} == {"7": "foreign", "8": "foreign"}
    assert report.removed == []
    assert (tmp_path / "7").is_dir()


def test_existing_step_without_force_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    _save(tmp_path, 1, seed=1)
    with pytest.raises(StepExistsError):
        _save(tmp_path, 1, seed=2)
    assert _same(_restored(tmp_path, 1), _state(1))
    assert not list(tmp_path.glob("*.nbckpt-*"))


@pytest.mark.parametrize("name", ["²", "٣", "1²", "\uff10", "007"])
def test_non_ascii_or_padded_digit_names_are_not_steps(tmp_path: Path, name: str) -> None:
    assert parse_step(name) is None
    _save(tmp_path, 2, seed=1)
    (tmp_path / name).mkdir()
    assert all_steps(tmp_path) == [2]
    assert [e.path for e in classify(tmp_path)] == ["2"]
    assert fsck(tmp_path, clean=True).removed == []
    assert _same(_restored(tmp_path, 2), _state(1))


def test_failed_resave_does_not_claim_the_old_step_is_new(tmp_path: Path) -> None:
    from nbckpt.engine import faults

    _save(tmp_path, 4, seed=1)
    faults.fail_io("finalize")
    try:
        with pytest.raises(Exception, match="previously committed step 4 is untouched"):
            _save(tmp_path, 4, seed=2, force=True)
    finally:
        faults.clear()
    assert _same(_restored(tmp_path, 4), _state(1))


def test_failure_in_retention_says_the_step_was_committed(tmp_path: Path) -> None:
    _save(tmp_path, 1, seed=1)
    _save(tmp_path, 2, seed=2)
    # A step retention cannot rename away: its parent is read-only for that moment.
    ckptr = AsyncCheckpointer(tmp_path, max_to_keep=1)
    os.chmod(tmp_path / "1", 0o500)
    blocker = tmp_path / "1.nbckpt-deleting"
    blocker.write_text("in the way")  # rename of a directory onto a file fails
    try:
        ckptr.save(3, _state(3))
        with pytest.raises(Exception, match="step 3 had been committed") as info:
            ckptr.wait_until_finished()
        assert "during retention" in str(info.value)
    finally:
        os.chmod(tmp_path / "1", 0o700)
        blocker.unlink()
    assert 3 in all_steps(tmp_path)
    assert json.loads((tmp_path / "3" / METADATA_FILE).read_text())["step"] == 3


def test_timeouts_must_be_finite_and_positive(tmp_path: Path) -> None:
    for bad in (float("nan"), float("inf"), 0, -1, "x", True):
        with pytest.raises(ValueError, match="timeout_s"):
            AsyncCheckpointer(tmp_path, timeout_s=bad)  # type: ignore[arg-type]
    with AsyncCheckpointer(tmp_path) as ckptr, pytest.raises(ValueError, match="finite"):
        ckptr.save(1, _state(1), timeout_s=float("nan"))
    assert not list(tmp_path.glob("1*"))


@pytest.mark.multihost
@pytest.mark.parametrize("mode", ["rename", "commit_file"])
def test_forced_resave_failing_at_each_phase_keeps_the_committed_step(
    group2, tmp_path: Path, mode: str
) -> None:
    root = str(tmp_path / "root")
    group2.run(f"{T}:save", root, 1)
    original = read_metadata(Path(root) / "1")
    assert original is not None
    # Only the primary (process 0) finalizes, so process 1 has no finalize to fail at.
    cases = [(0, p) for p in PHASES] + [(1, p) for p in PHASES if p != "finalize"]
    for victim, phase in cases:
        results = group2.run(f"{T}:resave_with_fault", root, mode, phase, victim)
        if mode == "commit_file":
            assert all(r["type"] == "CommitRefusedError" for r in results), results
        elif phase == "barrier:commit_complete":
            # Past the finalize the new step is committed, and the errors say so.
            assert all("had been committed" in r["error"] for r in results), results
            assert group2.run(f"{T}:restore_check", root, 1, 7) == [[], []]
            group2.run(f"{T}:resave_with_fault", root, mode, phase, -1, 1)
            original = read_metadata(Path(root) / "1")
        else:
            assert all(r["error"] is not None for r in results), (phase, results)
            assert all("untouched" in r["error"] for r in results), (phase, results)
        assert read_metadata(Path(root) / "1") == original, (victim, phase)
        assert group2.run(f"{T}:restore_check", root, 1, 1) == [[], []], (victim, phase)
        assert all_steps(root) == [1]


@pytest.mark.multihost
def test_a_variable_missing_on_one_process_fails_every_process_at_once(
    group2, tmp_path: Path
) -> None:
    root = str(tmp_path / "root")
    results = group2.run(f"{T}:agent_save_missing_on", root, 3, 1, timeout_s=60)
    assert results[1]["error"].startswith("NameError: name 'state' is not defined")
    assert results[0]["error"].startswith("PeerFailedError: process 1 failed: NameError")
    assert all_steps(root) == []
    assert not Path(root, "3").exists()


@pytest.mark.multihost
def test_a_key_used_again_is_refused_at_once_on_every_process(group2, tmp_path: Path) -> None:
    # A key names a call's records at the service; a second save under it met the
    # first's there: one process reported it done while the other waited it out.
    root = str(tmp_path / "root")
    outs = group2.run(f"{T}:agent_reused_key", root)
    for out in outs:
        assert out["again"].startswith("ValueError: key 'reused' was already used"), out
        assert "\n" not in out["again"]
    assert all_steps(root) == [1, 3]
    assert not [p.name for p in Path(root).iterdir() if p.name.startswith("2")]


@pytest.mark.multihost
def test_saves_to_one_root_never_overlap_whatever_their_options(group2, tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    errors = group2.run(f"{T}:agent_two_saves", root, 5)
    # The second save (other timeout, forced) waited for the first, then replaced it
    # whole: the step holds the second save's data and metadata, not a mix.
    assert errors == [[None, None], [None, None]]
    assert group2.run(f"{T}:restore_check", root, 5, 105) == [[], []]
    meta = read_metadata(Path(root) / "5")
    assert meta is not None and meta["mode"] == "rename"


def test_a_deleted_checksums_folder_is_damage_not_an_old_step(tmp_path: Path) -> None:
    import shutil

    from nbckpt.errors import CorruptCheckpointError

    _save(tmp_path, 1, seed=1)
    shutil.rmtree(tmp_path / "1" / "_CHECKSUMS")
    with pytest.raises(CorruptCheckpointError, match="checksums are missing"):
        _restored(tmp_path, 1)
