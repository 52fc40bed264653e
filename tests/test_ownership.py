"""One owner per step, and one plan per save: two jobs on one root, processes that differ.

The jobs are real: a worker process (``group1``, a JAX process of its own) and this
test process, each with its own :class:`AsyncCheckpointer`, not joined to each other.
Hooks pause the worker's save at a phase, so the interleaving is deterministic.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.errors import StepBusyError
from nbckpt.formats.layout import OWNER_FILE, all_steps, read_metadata
from tests.mh_owner import values

T = "tests.mh_owner"


def _restored(root: Path, step: int) -> dict[str, np.ndarray]:
    with AsyncCheckpointer(root) as ckptr:
        return ckptr.restore(step)  # type: ignore[no-any-return]


def _same(a: dict[str, Any], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), b[k]) for k in b)


def _wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _start_held(group1: Any, root: Path, gate: Path, phase: str, **kw: Any) -> None:
    gate.mkdir()
    group1.submit(f"{T}:held_save", str(root), 5, 1, phase, str(gate), kwargs=kw)
    _wait_for(gate / "reached")


@pytest.mark.multihost
@pytest.mark.parametrize("phase", ["barrier:tmp_ready", "barrier:write_complete"])
def test_a_second_job_saving_the_same_step_fails_at_once_naming_the_first(
    group1: Any, tmp_path: Path, phase: str
) -> None:
    root, gate = tmp_path / "root", tmp_path / "gate"
    _start_held(group1, root, gate, phase)
    t0 = time.monotonic()
    with pytest.raises(StepBusyError) as info, AsyncCheckpointer(root) as ckptr:
        ckptr.save(5, values(2))
    assert time.monotonic() - t0 < 10
    message = str(info.value)
    worker_pid = int((gate / "reached").read_text())
    assert f"pid {worker_pid}" in message and socket.gethostname() in message
    assert "-save-5" in message and "\n" not in message
    (gate / "go").write_text("")
    [result] = group1.collect("held_save", 120)
    assert result["error"] is None, result
    assert result["op"] in message
    # The step is the first job's, whole, with its checksums.
    assert _same(_restored(root, 5), values(1))
    meta = read_metadata(root / "5")
    assert meta is not None and meta["op"] == result["op"]
    assert (root / "5" / "_CHECKSUMS").is_dir()
    assert not list(root.glob("*.nbckpt-*"))


@pytest.mark.multihost
def test_finalize_never_replaces_a_step_committed_since_the_preflight(
    group1: Any, tmp_path: Path
) -> None:
    root, gate, other = tmp_path / "root", tmp_path / "gate", tmp_path / "other"
    _start_held(group1, root, gate, "finalize")
    # Meanwhile another job committed step 5 (saved elsewhere, renamed into the root).
    with AsyncCheckpointer(other) as ckptr:
        ckptr.save(5, values(2))
    os.rename(other / "5", root / "5")
    (gate / "go").write_text("")
    [result] = group1.collect("held_save", 120)
    assert result["error"] is not None and result["error"].startswith("CheckpointError")
    assert "already committed" in result["error"], result
    assert _same(_restored(root, 5), values(2))
    assert all_steps(root) == [5]


@pytest.mark.multihost
def test_finalize_with_force_replaces_a_step_committed_meanwhile(
    group1: Any, tmp_path: Path
) -> None:
    root, gate, other = tmp_path / "root", tmp_path / "gate", tmp_path / "other"
    _start_held(group1, root, gate, "finalize", force=True)
    with AsyncCheckpointer(other) as ckptr:
        ckptr.save(5, values(2))
    os.rename(other / "5", root / "5")
    (gate / "go").write_text("")
    [result] = group1.collect("held_save", 120)
    assert result["error"] is None, result
    assert _same(_restored(root, 5), values(1))


def _hold(release: Any) -> None:
    release.wait(60)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _fake_claim(root: Path, step: int, pid: int, t: float | None = None) -> Path:
    tmp = root / f"{step}.nbckpt-tmp"
    tmp.mkdir(parents=True)
    (tmp / "junk").write_bytes(b"half a chunk")
    record = {
        "format": "nbckpt/1",
        "op": "20260101T000000.000000Z-save-5",
        "mode": "rename",
        "step": step,
        "host": socket.gethostname(),
        "pid": pid,
        "time": time.time() if t is None else t,
    }
    (tmp / OWNER_FILE).write_text(json.dumps(record))
    return tmp


def test_a_claim_of_a_crashed_save_on_this_host_is_reclaimed(tmp_path: Path) -> None:
    _fake_claim(tmp_path, 5, _dead_pid())
    with AsyncCheckpointer(tmp_path) as ckptr:
        ckptr.save(5, values(3))
    assert _same(_restored(tmp_path, 5), values(3))
    assert not list(tmp_path.glob("*.nbckpt-*")) and not list(tmp_path.glob(".*deleting"))


def test_a_live_claim_is_refused_and_left_whole(tmp_path: Path) -> None:
    # A live process of this host (ours) owns it, and its save journaled nothing yet.
    tmp = _fake_claim(tmp_path, 5, os.getppid())
    ckptr = AsyncCheckpointer(tmp_path)
    with pytest.raises(StepBusyError, match=f"pid {os.getppid()}"):
        ckptr.save(5, values(3))
    assert (tmp / "junk").read_bytes() == b"half a chunk"
    # Silent for longer than a save may be: stale, whoever owns it.
    shutil.rmtree(tmp)
    _fake_claim(tmp_path, 5, os.getppid(), t=time.time() - 3600)
    ckptr.save(5, values(3))
    ckptr.close()
    assert _same(_restored(tmp_path, 5), values(3))


def test_a_failed_save_of_this_process_leaves_a_claim_the_next_save_takes(
    tmp_path: Path,
) -> None:
    from nbckpt.engine import hooks
    from nbckpt.errors import CheckpointError

    def boom(_phase: str) -> None:
        raise OSError(5, "injected")

    ckptr = AsyncCheckpointer(tmp_path)
    hooks.set_hook("barrier:write_complete", boom)
    try:
        ckptr.save(4, values(1))
        with pytest.raises(CheckpointError):
            ckptr.wait_until_finished()
    finally:
        hooks.clear_hooks()
    assert (tmp_path / "4.nbckpt-tmp").is_dir()
    ckptr.save(4, values(2))
    ckptr.wait_until_finished()
    assert _same(_restored(tmp_path, 4), values(2))


@pytest.mark.multihost
@pytest.mark.parametrize("what", ["format", "mode", "leaf", "shape", "force"])
def test_processes_that_disagree_fail_every_process_before_anything_is_written(
    group2: Any, tmp_path: Path, what: str
) -> None:
    root = tmp_path / "root"
    errors = group2.run(f"{T}:save_disagreeing", str(root), 3, what, 1, timeout_s=120)
    assert errors[0] == errors[1], errors
    error = errors[0]
    assert error is not None and error.startswith("DisagreementError"), errors
    assert "vanish" not in error and "\n" not in error
    expected = {
        "format": "format: nbckpt on process 0, orbax on process 1",
        "mode": "mode: rename on process 0, commit_file on process 1",
        "leaf": "leaf 'extra': absent on process 0, float32[3] numpy on process 1",
        "shape": "leaf 'w': float32[16, 8] numpy on process 0, float32[16, 9] numpy on process 1",
        "force": "force: False on process 0, True on process 1",
    }[what]
    assert expected in error, error
    assert not root.exists() or sorted(p.name for p in root.iterdir()) in ([], [".nbckpt"])


@pytest.fixture(scope="module")
def s3_env() -> Any:
    from tests.s3server import S3Server

    with S3Server() as server:
        yield server


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_checkpointers_of_one_process_never_share_a_step(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two notebooks' checkpointers in one kernel: the second is refused while the first
    writes, on a local root and on an object store (commit-file mode) alike."""
    import threading
    import uuid

    from nbckpt.engine import hooks

    root: str | Path = tmp_path
    if where == "s3":
        server = request.getfixturevalue("s3_env")
        bucket = f"ck-{uuid.uuid4().hex[:10]}"
        server.create_bucket(bucket)
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        root = f"s3://{bucket}/runs/a"
    release = threading.Event()
    hooks.set_hook("barrier:write_complete", lambda _p: _hold(release))
    first = AsyncCheckpointer(root)
    try:
        first.save(5, values(1))
        with pytest.raises(StepBusyError, match=f"pid {os.getpid()}"):
            AsyncCheckpointer(root).save(5, values(2))
        release.set()
        first.wait_until_finished()
    finally:
        release.set()
        hooks.clear_hooks()
    second = AsyncCheckpointer(root)
    assert _same(second.restore(5), values(1))
    assert all_steps(root) == [5]


@pytest.mark.parametrize(
    ("first", "second"), [("rename", "commit_file"), ("commit_file", "rename")]
)
def test_a_save_in_the_other_mode_is_refused_too(tmp_path: Path, first: str, second: str) -> None:
    """Rename mode writes ``<step>.nbckpt-tmp``, commit-file mode ``<step>``: each sees
    the other's live claim, so the two never write one step at once."""
    import threading

    from nbckpt.engine import hooks

    release = threading.Event()
    hooks.set_hook("barrier:write_complete", lambda _p: _hold(release))
    ckptr = AsyncCheckpointer(tmp_path)
    try:
        ckptr.save(5, values(1), mode=first)  # type: ignore[arg-type]
        with pytest.raises(StepBusyError, match="being written by another save"):
            AsyncCheckpointer(tmp_path).save(5, values(2), mode=second)  # type: ignore[arg-type]
        release.set()
        ckptr.wait_until_finished()
    finally:
        release.set()
        hooks.clear_hooks()
    assert _same(_restored(tmp_path, 5), values(1))
    assert all_steps(tmp_path) == [5] and not list(tmp_path.glob("*.nbckpt-*"))


@pytest.mark.parametrize("conditional", ["emulated", "sent"])
def test_an_owner_record_on_an_object_store_is_created_once(
    s3_env: Any, monkeypatch: pytest.MonkeyPatch, conditional: str
) -> None:
    """The object-store claim's exclusive create, both ways tensorstore makes it: the
    second creator is told no and the first one's record stays."""
    import uuid

    from nbckpt.storage import location

    bucket = f"ck-{uuid.uuid4().hex[:10]}"
    s3_env.create_bucket(bucket)
    for key, value in s3_env.env().items():
        monkeypatch.setenv(key, value)
    # Sent as If-None-Match (as to AWS), or checked by tensorstore before the write.
    monkeypatch.setenv(
        "TENSORSTORE_S3_USE_CONDITIONAL_WRITE", "1" if conditional == "sent" else "0"
    )
    record = location(f"s3://{bucket}/runs/a") / "5" / "_NBCKPT_OWNER"
    assert record.create_exclusive(b"first")  # type: ignore[union-attr]
    assert not record.create_exclusive(b"second")  # type: ignore[union-attr]
    assert record.read_bytes() == b"first"


@pytest.mark.multihost
def test_the_service_keeps_the_keys_of_a_checkpointers_last_operation_only(
    group2: Any, tmp_path: Path
) -> None:
    # The primary drops the keys of earlier operations in the background as each
    # agreement passes; whatever else the service holds was there before.
    before = group2.run(f"{T}:service_keys", str(tmp_path / "a"), 2)[0]
    after = group2.run(f"{T}:service_keys", str(tmp_path / "b"), 5)[0]
    # Six operations (five saves and a restore) leave one operation's keys: the last's,
    # which the checkpointer's next operation drops.
    assert len(set(after) - set(before)) == 1, (before, after)
