"""Checkpoints on an S3-compatible store: a real S3 server (moto) on 127.0.0.1.

Real JAX processes save to and restore from ``s3://`` roots through tensorstore's s3
driver; the readers (layout, journal, inventory, fsck, retention) run here against the
same bucket. Store failures are real too: a proxy in front of the server answers 503
SlowDown or stops answering, and a second server checks credentials.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nbckpt import storage
from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import (
    CheckpointError,
    PeerFailedError,
    RenameUnavailableError,
    StorageURLError,
)
from nbckpt.formats import inventory
from nbckpt.formats.fsck import fsck
from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE, all_steps, entry_state, latest_step
from nbckpt.journal import (
    SUMMARY_FILE,
    _summary,
    list_operations,
    read_operation,
    summarize,
)
from nbckpt.procgroup import ProcessGroup
from nbckpt.protocol import PHASES
from nbckpt.storage import S3Path
from tests.ckpt_fixtures import api_get
from tests.conftest import _ENV
from tests.s3server import FaultProxy, S3Server

pytestmark = pytest.mark.multihost
T = "tests.mh_s3"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def root(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with this process's environment pointing at the server."""
    name = f"ck-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(name)
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return f"s3://{name}/runs/a"


def _keys(root: str) -> list[str]:
    loc = storage.location(root)
    assert isinstance(loc, S3Path)
    return loc.list_keys()


# -- 4 processes save, 2 restore -----------------------------------------------------


def test_save_4_restore_2_bit_for_bit(group4, group2, s3, root):
    env = s3.env()
    out = group4.run(f"{T}:save", env, root, 1)
    assert [o["error"] for o in out] == [None] * 4
    # Commit-object mode was chosen for the bucket, without asking.
    assert {o["mode"] for o in out} == {"commit_file"}
    keys = _keys(root)
    assert f"1/{COMMIT_FILE}" in keys and f"1/{METADATA_FILE}" in keys
    assert not any(".nbckpt-tmp" in k for k in keys)
    # Nothing was written locally under a directory named after the URL.
    assert not Path("s3:").exists()
    assert all_steps(root) == [1] and latest_step(root) == 1
    assert entry_state(storage.location(root) / "1") == "complete"
    assert group2.run(f"{T}:restore_check", env, root, 1, 1) == [[], []]
    assert group4.run(f"{T}:restore_check", env, root, None, 1) == [[]] * 4


def test_journal_and_views_read_from_the_bucket(group2, s3, root):
    env = s3.env()
    ops = [o["op"] for o in group2.run(f"{T}:save", env, root, 3)]
    assert ops[0] == ops[1]
    assert list_operations(root) == [ops[0]]
    record = read_operation(root, ops[0])
    assert record.status == "committed" and record.process_count == 2
    for proc in record.processes.values():
        names = [e["event"] for e in proc.events]
        assert names[0] == "requested" and names[-1] == "committed"
        assert proc.bytes_written > 0
    rows = inventory.list_steps(root)
    assert [r["step"] for r in rows] == [3]
    # Once every process recorded the commit, the primary gathered the records into
    # one object: a reader then makes one request for the save, not one per process.
    keys = _op_keys(root, ops[0])
    assert keys == [SUMMARY_FILE]
    again = read_operation(root, ops[0])
    assert again.status == "committed" and again.process_count == 2
    # The same events, read from one object.
    assert {p: r.events for p, r in again.processes.items()} == {
        p: r.events for p, r in record.processes.items()
    }
    assert [r["step"] for r in inventory.list_steps(root)] == [3]
    assert list_operations(root) == [ops[0]]
    # A restore ends as one object too, gathered by process 0.
    (op, problems), second = group2.run(f"{T}:restore_op", env, root, 3)
    assert problems == [] and second == (op, [])
    assert _op_keys(root, op) == [SUMMARY_FILE]
    restored = read_operation(root, op)
    assert restored.status == "restored" and restored.process_count == 2


def _op_keys(root: str, op: str, wait_s: float = 30.0) -> list[str]:
    """The keys of an operation's journal folder once the summary is there (or not)."""
    folder = storage.location(root) / ".nbckpt" / "ops" / op
    assert isinstance(folder, S3Path)
    deadline = time.monotonic() + wait_s
    while True:
        keys = sorted(folder.list_keys())
        if keys == [SUMMARY_FILE] or time.monotonic() > deadline:
            return keys
        time.sleep(0.1)


def _no_wait(seconds: float) -> None:
    raise AssertionError(f"waited {seconds} s for a save that had failed")


def _record(process: int, *events: str, **extra: object) -> bytes:
    lines = [
        {"t": 1.0 + i, "event": e, "kind": "save", "step": 1, "process": process, **extra}
        for i, e in enumerate(events)
    ]
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_only_a_committed_save_is_gathered_into_one_object(root):
    base = storage.location(root) / ".nbckpt" / "ops"
    assert isinstance(base, S3Path)
    done = ("requested", "write_done", "committed")
    # A process that failed keeps its evidence where it wrote it: nothing is gathered,
    # and nothing is waited for.
    failed = base / "a"
    (failed / "process_0.jsonl").write_bytes(_record(0, *done))
    (failed / "process_1.jsonl").write_bytes(_record(1, "requested", "failed"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_summary, "_sleep", _no_wait)
        assert summarize(failed, 2, wait_s=20, poll_s=0.1) is False
    assert sorted(failed.list_keys()) == ["process_0.jsonl", "process_1.jsonl"]
    # Nor a save a preemption notice asked for: its processes write once they may stop.
    told = base / "b"
    for p in (0, 1):
        (told / f"process_{p}.jsonl").write_bytes(_record(p, *done, preemption={"t": 1}))
    assert summarize(told, 2, wait_s=0.5, poll_s=0.1) is False
    assert sorted(told.list_keys()) == ["process_0.jsonl", "process_1.jsonl"]
    # A committed one: one object, the same events; a process that has not recorded
    # its commit yet is waited for.
    ok = base / "c"
    (ok / "process_0.jsonl").write_bytes(_record(0, *done))
    (ok / "process_1.jsonl").write_bytes(_record(1, *done[:2]))
    gathered: list[bool] = []
    thread = threading.Thread(target=lambda: gathered.append(summarize(ok, 2)))
    thread.start()
    time.sleep(0.5)
    assert SUMMARY_FILE not in ok.list_keys()
    (ok / "process_1.jsonl").write_bytes(_record(1, *done))
    thread.join(timeout=30)
    assert gathered == [True] and sorted(ok.list_keys()) == [SUMMARY_FILE]
    rec = read_operation(root, "c")
    assert [[e["event"] for e in rec.processes[p].events] for p in (0, 1)] == [list(done)] * 2


def test_retention_deletes_only_old_steps_there(group2, s3, root):
    env = s3.env()
    for step in (1, 2, 3):
        out = group2.run(f"{T}:save", env, root, step, kwargs={"max_to_keep": 2})
        assert [o["error"] for o in out] == [None, None]
    assert all_steps(root) == [2, 3]
    assert not any(k.startswith("1/") for k in _keys(root))
    assert group2.run(f"{T}:restore_check", env, root, 2, 2) == [[], []]


def test_a_committed_step_is_never_replaced_in_place(group2, s3, root):
    env = s3.env()
    group2.run(f"{T}:save", env, root, 1)
    before = {k: (storage.location(root) / k).read_bytes() for k in _keys(root) if k[0] == "1"}
    out = group2.run(f"{T}:save", env, root, 1, kwargs={"force": True})
    assert {o["type"] for o in out} == {"CommitRefusedError"}
    assert "object stores have no rename" in out[0]["error"]
    after = {k: (storage.location(root) / k).read_bytes() for k in _keys(root) if k[0] == "1"}
    assert after == before
    assert group2.run(f"{T}:restore_check", env, root, 1, 1) == [[], []]


def test_rename_mode_and_unknown_schemes_are_refused(root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RenameUnavailableError, match="rename mode is not available at s3://"):
        AsyncCheckpointer(root, mode="rename")
    with pytest.raises(StorageURLError, match="gs://b/x"):
        AsyncCheckpointer("gs://b/x")
    assert list(tmp_path.iterdir()) == []  # no local "s3:" or "gs:" directory
    assert AsyncCheckpointer(root).options.mode == "commit_file"
    assert AsyncCheckpointer(tmp_path / "local").options.mode == "rename"


# -- a process killed at each phase --------------------------------------------------


@pytest.mark.parametrize("phase", PHASES)
def test_killing_a_process_at_each_phase_leaves_no_partial_step(phase, s3, root, tmp_path):
    env = s3.env()
    marker = str(tmp_path / "died_at")
    with ProcessGroup(2, env=_ENV, recoverable=True) as group:
        group.run(f"{T}:save", env, root, 1, kwargs={"primary": 1})
        group.run(f"{T}:arm_kill", 1, phase, marker)
        group.submit(f"{T}:save", env, root, 2, kwargs={"primary": 1})
        outcomes = group.outcomes(timeout_s=90)
    assert outcomes[1][0] is False  # the victim
    ok, res = outcomes[0]
    assert ok and res["error"] is not None and "process 1 died" in res["error"], res
    if phase == "barrier:commit_complete":
        # The primary had written the commit object before it died: step 2 is complete.
        assert all_steps(root) == [1, 2]
        return
    assert all_steps(root) == [1]
    state = entry_state(storage.location(root) / "2")
    assert state in ("incomplete", "foreign"), state  # never complete, never corrupt
    assert f"2/{COMMIT_FILE}" not in _keys(root)
    # fsck removes what the failed save left (its own, by the owner record), only that.
    step1 = {k: (storage.location(root) / k).read_bytes() for k in _keys(root) if k[0] == "1"}
    report = fsck(root, clean=True)
    assert not any(k.startswith("2/") for k in _keys(root)), report.table()
    assert {k: (storage.location(root) / k).read_bytes() for k in step1} == step1
    assert all_steps(root) == [1]


# -- failures of the store -----------------------------------------------------------


def test_missing_bucket_is_one_line_naming_the_url(group2, s3):
    env = s3.env()
    out = group2.run(f"{T}:save", env, "s3://no-such-bucket/x", 1)
    for o in out:
        assert o["type"] == "PeerFailedError", o
        assert "bucket 'no-such-bucket' does not exist" in o["error"]
        assert "s3://no-such-bucket/x" in o["error"] and "nothing was saved" in o["error"]
        assert "\n" not in o["error"]


def test_wrong_credentials_are_named(tmp_path, monkeypatch):
    with S3Server(check_credentials=True) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        with pytest.raises(PeerFailedError) as info:
            AsyncCheckpointer("s3://any-bucket/x").save(1, {"w": np.ones(4, np.float32)})
    msg = str(info.value)
    assert "refused the credentials" in msg and "AWS_ACCESS_KEY_ID" in msg, msg


def test_unreachable_endpoint_fails_fast_with_advice(monkeypatch):
    from tests.s3server import closed_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    t0 = time.monotonic()
    with pytest.raises(PeerFailedError) as info:
        AsyncCheckpointer("s3://some-bucket/x").save(1, {"w": np.ones(4, np.float32)})
    assert time.monotonic() - t0 < 60
    msg = str(info.value)
    assert "did not answer" in msg and "AWS_ENDPOINT_URL" in msg, msg


@pytest.fixture
def proxied(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultProxy, str]]:
    """A bucket reached through a fault proxy, from this process."""
    name = f"ck-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(name)
    with FaultProxy(s3.endpoint) as proxy:
        for key, value in proxy.env().items():
            monkeypatch.setenv(key, value)
        yield proxy, f"s3://{name}/p"


def test_throttling_is_retried_then_named(proxied):
    proxy, root = proxied
    state = {"w": np.arange(1024, dtype=np.float32)}
    ck = AsyncCheckpointer(root)
    proxy.throttle(4)
    ck.save(1, state)
    ck.wait_until_finished()
    assert proxy.throttled == 4 and all_steps(root) == [1]
    proxy.throttle_forever(True)
    try:
        with pytest.raises((CheckpointError, PeerFailedError)) as info:
            ck.save(2, state)
            ck.wait_until_finished()
    finally:
        proxy.throttle_forever(False)
    assert "SlowDown" in str(info.value) and root in str(info.value), str(info.value)
    assert all_steps(root) == [1]
    np.testing.assert_array_equal(np.asarray(ck.restore(1)["w"]), state["w"])


def test_a_store_that_dies_mid_save_leaves_the_last_step(proxied):
    proxy, root = proxied
    state = {"w": np.arange(4096, dtype=np.float32)}
    ck = AsyncCheckpointer(root)
    ck.save(1, state)
    ck.wait_until_finished()
    hooks.set_hook("write", lambda _phase: proxy.down(True))
    try:
        # The journal is an observer: it says once that it lost the history, no more.
        with pytest.warns(RuntimeWarning, match="cannot write journal") as warned:
            ck.save(2, state)
            with pytest.raises(CheckpointError) as info:
                ck.wait_until_finished()
        assert len([w for w in warned if "journal" in str(w.message)]) == 1
    finally:
        hooks.clear_hooks()
        proxy.down(False)
    msg = str(info.value)
    assert "did not answer" in msg and root in msg and "process 0" in msg, msg
    assert all_steps(root) == [1]
    assert COMMIT_FILE not in [p.name for p in (storage.location(root) / "2").iterdir()]
    np.testing.assert_array_equal(np.asarray(ck.restore(1)["w"]), state["w"])


# -- the server routes (the sidebar's data) ------------------------------------------


async def test_server_routes_list_a_bucket_root_with_the_servers_credentials(
    jp_fetch, root, monkeypatch
):
    ck = AsyncCheckpointer(root)
    ck.save(1, {"w": np.arange(8, dtype=np.float32)})
    ck.wait_until_finished()
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": root})
    assert code == 200, data
    assert data["root"] == root
    [entry] = data["entries"]
    assert (entry["step"], entry["state"], entry["bytes"]) == (1, "complete", None)
    code, data = await api_get(jp_fetch, "operations", params={"root": root})
    assert code == 200 and [o["status"] for o in data["operations"]] == ["committed"]
    op = data["operations"][0]["op"]
    code, data = await api_get(jp_fetch, "operations", op, params={"root": root})
    assert code == 200 and data["status"] == "committed"
    # Same authentication as every route.
    code, _ = await api_get(
        jp_fetch, "checkpoints", params={"root": root}, headers={"Authorization": ""}
    )
    assert code == 403
    # A store failure is one line, 502.
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": "s3://no-such-bucket/r"})
    assert code == 502 and "does not exist" in data["message"], data
    # Without credentials in the server's environment, buckets are not read at all.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": root})
    assert code == 403 and "no credentials" in data["message"], data


async def test_a_hanging_store_does_not_stall_the_server(jp_fetch, proxied):
    import asyncio

    proxy, root = proxied
    proxy.down(True)  # every request to the store goes unanswered (then retried)
    slow = asyncio.ensure_future(api_get(jp_fetch, "checkpoints", params={"root": root}))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    code, _ = await api_get(jp_fetch, "protocol")
    assert code == 200 and time.monotonic() - t0 < 3
    assert not slow.done()  # still waiting on the store, while the server answered
    code, data = await slow
    assert code == 502 and "did not answer" in data["message"], data
