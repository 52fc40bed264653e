"""fsck over a root prepared by real saves (complete, abandoned, corrupt, in progress)."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import CheckpointError
from nbckpt.formats.fsck import fsck
from nbckpt.formats.layout import all_steps


def _state(k: float) -> dict:
    return {"w": jax.numpy.arange(4096.0).reshape(64, 64) * k, "n": np.arange(5)}


@pytest.fixture
def root(tmp_path):
    """Steps 1, 2, 3 complete; 4 abandoned (its write failed); 3 gets corrupted later."""
    ck = AsyncCheckpointer(tmp_path, pack_bytes=0)  # its tests damage the leaves' arrays
    for step in (1, 2, 3):
        ck.save(step, _state(step))
        ck.wait_until_finished()

    def boom(_phase):
        raise OSError(5, "injected")

    hooks.set_hook("barrier:write_complete", boom)
    try:
        ck.save(4, _state(4))
        with pytest.raises(CheckpointError):
            ck.wait_until_finished()
    finally:
        hooks.clear_hooks()
    return tmp_path


def test_classification_and_clean_only_removes_abandoned(root):
    report = fsck(root)
    states = {e.path: e.state for e in report.entries}
    assert states == {
        "1": "complete",
        "2": "complete",
        "3": "complete",
        "4.nbckpt-tmp": "abandoned",
    }
    report = fsck(root, clean=True)
    assert report.removed == ["4.nbckpt-tmp"]
    assert not (root / "4.nbckpt-tmp").exists()
    assert all_steps(root) == [1, 2, 3]
    assert "3 complete, 0 in progress, 1 abandoned, 0 corrupt, 0 foreign; removed 1" in (
        report.table()
    )


def test_verify_finds_a_flipped_byte_and_a_missing_array(root):
    assert fsck(root, verify=True).by_state("corrupt") == []
    chunk = next((root / "2" / "w").glob("0*"))
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    import shutil

    shutil.rmtree(root / "3" / "n")
    plain = {e.path: e.state for e in fsck(root).entries}
    assert plain["2"] == "complete"  # only reading the data shows the flipped byte
    assert plain["3"] == "corrupt"
    verified = fsck(root, verify=True, clean=True)
    by_path = {e.path: e for e in verified.entries}
    assert by_path["2"].state == "corrupt" and "checksum" in by_path["2"].reason
    assert by_path["1"].state == "complete"
    # --clean never removes a complete or a corrupt step.
    assert verified.removed == ["4.nbckpt-tmp"]
    assert (root / "2").is_dir() and (root / "3").is_dir()


def test_a_running_save_is_in_progress_and_survives_clean(tmp_path):
    release = threading.Event()
    hooks.set_hook("finalize", lambda _p: release.wait(20))
    try:
        ck = AsyncCheckpointer(tmp_path)
        ck.save(7, _state(7))
        deadline = time.monotonic() + 10
        while not (tmp_path / "7.nbckpt-tmp").is_dir() and time.monotonic() < deadline:
            time.sleep(0.01)
        report = fsck(tmp_path, clean=True)
        assert {e.path: e.state for e in report.entries} == {"7.nbckpt-tmp": "in_progress"}
        assert report.removed == []
        release.set()
        ck.wait_until_finished()
    finally:
        hooks.clear_hooks()
        release.set()
    assert all_steps(tmp_path) == [7]


def test_fsck_magic(root, capsys):
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbckpt")
    ip.run_line_magic("ckpt_fsck", f"{root} --clean")
    out = capsys.readouterr().out
    assert "4.nbckpt-tmp" in out and "(removed)" in out and "abandoned" in out
    with pytest.raises(UsageError, match="no directory"):
        ip.run_line_magic("ckpt_fsck", str(root / "nope"))
    with pytest.raises(UsageError, match="unrecognized"):
        ip.run_line_magic("ckpt_fsck", f"{root} --bogus")


@pytest.mark.parametrize("how", ["commit_file_removed", "owner_removed_and_mode_edited"])
def test_clean_never_deletes_a_step_the_journal_says_committed(tmp_path, how):
    import json

    from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE, OWNER_FILE

    mode = "commit_file" if how == "commit_file_removed" else "rename"
    ck = AsyncCheckpointer(tmp_path)
    ck.save(3, _state(3), mode=mode)
    ck.wait_until_finished()
    step = tmp_path / "3"
    if how == "commit_file_removed":
        (step / COMMIT_FILE).unlink()
    else:
        (step / OWNER_FILE).unlink()
        meta = json.loads((step / METADATA_FILE).read_text())
        meta["mode"] = "commit_file"
        (step / METADATA_FILE).write_text(json.dumps(meta))
    files = sorted(p.relative_to(step) for p in step.rglob("*"))
    report = fsck(tmp_path, clean=True, stale_after_s=0)
    [entry] = report.entries
    assert entry.state == "corrupt" and "committed" in entry.reason and "attention" in entry.reason
    assert report.removed == []
    assert sorted(p.relative_to(step) for p in step.rglob("*")) == files
    # A save of that step is refused too, rather than reclaiming its files.
    with pytest.raises(Exception, match="already committed"):
        ck.save(3, _state(4), mode="commit_file")
    assert sorted(p.relative_to(step) for p in step.rglob("*")) == files
