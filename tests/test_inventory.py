"""The classification of a root's entries (nbckpt.formats.inventory), on prepared directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nbckpt.formats.inventory import classify, find_save_op
from nbckpt.formats.layout import DELETING_SUFFIX
from tests.ckpt_fixtures import journal, write_step, write_tmp


def _states(root: Path, **kw: float) -> dict[str, str]:
    return {e.path: e.state for e in classify(root, **kw)}


def test_missing_root_has_no_entries(tmp_path: Path) -> None:
    assert classify(tmp_path / "nope") == []


def test_complete_steps_carry_metadata_size_and_journal_op(tmp_path: Path) -> None:
    journal(tmp_path, "20260101T000000.000001-save-10", 10)
    write_step(tmp_path, 10, op="20260101T000000.000001-save-10", finalized=1234.5)
    write_step(tmp_path, 20, mode="commit_file", op="op-without-journal", processes=3)
    (tmp_path / "notes.txt").write_text("not a step")
    (tmp_path / "010").mkdir()  # leading zero: not a step name
    e10, e20 = classify(tmp_path)
    assert (e10.step, e10.state, e10.mode, e10.process_count) == (10, "complete", "rename", 2)
    assert e10.op == "20260101T000000.000001-save-10"
    assert e10.time == 1234.5
    assert e10.bytes >= 2 * 64
    assert (e20.state, e20.mode, e20.process_count, e20.op) == (
        "complete",
        "commit_file",
        3,
        None,
    )


def test_corrupt_when_metadata_unreadable_or_array_missing(tmp_path: Path) -> None:
    write_step(tmp_path, 1, missing=("params.w",))
    write_step(tmp_path, 2, mode="commit_file", metadata="{not json")
    entries = {e.step: e for e in classify(tmp_path)}
    assert entries[1].state == "corrupt" and "params.w" in entries[1].reason
    assert entries[2].state == "corrupt" and "unreadable" in entries[2].reason


def test_temporary_entries_follow_their_journal(tmp_path: Path) -> None:
    now = 5000.0
    journal(tmp_path, "20260101T000000.000001-save-1", 1, outcome="running", t0=now - 5)
    journal(tmp_path, "20260101T000000.000002-save-2", 2, outcome="failed", t0=now - 5)
    journal(tmp_path, "20260101T000000.000003-save-3", 3, outcome="running", t0=now - 4000)
    for step in (1, 2, 3, 4):
        write_tmp(tmp_path, step)
    # A commit-file save that has not written its commit file yet.
    journal(tmp_path, "20260101T000000.000005-save-5", 5, outcome="running", t0=now - 5)
    write_step(tmp_path, 5, mode="commit_file", committed=False)
    (tmp_path / f"7{DELETING_SUFFIX}").mkdir()
    entries = {e.path: e for e in classify(tmp_path, now=now, stale_after_s=600)}
    assert {p: e.state for p, e in entries.items()} == {
        "1.nbckpt-tmp": "in_progress",
        "2.nbckpt-tmp": "abandoned",
        "3.nbckpt-tmp": "abandoned",
        "4.nbckpt-tmp": "abandoned",
        "5": "in_progress",
        "7.nbckpt-deleting": "abandoned",
    }
    assert "failed" in entries["2.nbckpt-tmp"].reason
    assert "KeyboardInterrupt" in entries["2.nbckpt-tmp"].reason
    assert "recorded nothing" in entries["3.nbckpt-tmp"].reason
    assert "no journal" in entries["4.nbckpt-tmp"].reason
    assert entries["1.nbckpt-tmp"].op == "20260101T000000.000001-save-1"
    assert entries["1.nbckpt-tmp"].process_count == 2
    assert entries["5"].mode == "commit_file"


def test_staleness_is_measured_from_the_newest_event(tmp_path: Path) -> None:
    journal(tmp_path, "20260101T000000.000001-save-1", 1, outcome="running", t0=1000.0)
    write_tmp(tmp_path, 1)
    assert _states(tmp_path, now=1100.0, stale_after_s=200.0) == {"1.nbckpt-tmp": "in_progress"}
    assert _states(tmp_path, now=1400.0, stale_after_s=200.0) == {"1.nbckpt-tmp": "abandoned"}


def test_newest_save_of_a_step_wins_and_restores_are_ignored(tmp_path: Path) -> None:
    journal(tmp_path, "20260101T000000.000001-save-3", 3, outcome="failed")
    journal(tmp_path, "20260101T000000.000002-save-3", 3, outcome="committed")
    journal(tmp_path, "20260101T000000.000003-restore-3", 3, kind="restore")
    assert find_save_op(tmp_path, 3) == "20260101T000000.000002-save-3"
    assert find_save_op(tmp_path, 4) is None


def test_symlinked_entries_are_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_step(elsewhere, 9)
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(elsewhere / "9", root / "9")
    assert classify(root) == []


def test_inventory_does_not_import_jax() -> None:
    code = (
        "import nbckpt.formats.inventory, sys;print('jax' in sys.modules, 'tornado' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
