"""What only one S3 server shows: moto on 127.0.0.1, behind a fault proxy.

The tests every object store passes (save and restore across process counts, the
journal, retention, a process killed at each phase, a missing bucket, a store killed
mid-save) are in ``test_object_stores.py``, against moto, SeaweedFS and
fake-gcs-server. Here: the journal's gathering rules, throttling and a store that stops
answering (a proxy in front of the server answers 503 SlowDown or nothing), wrong
credentials (moto checking them, and SeaweedFS), and a hanging store that must not
stall the Jupyter server.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from nbckpt import storage
from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import (
    CheckpointError,
    PeerFailedError,
    StorageURLError,
)
from nbckpt.formats.layout import COMMIT_FILE, all_steps
from nbckpt.journal import (
    SUMMARY_FILE,
    _summary,
    read_operation,
    summarize,
)
from nbckpt.storage import S3Path
from nbckpt.storage.local_seaweed import SeaweedServer
from tests.ckpt_fixtures import api_get
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


def test_unknown_schemes_and_bad_bucket_names_are_refused(root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageURLError, match="az://b/x"):
        AsyncCheckpointer("az://b/x")
    # GCS's own rule, said before any request: 3 to 63 lowercase characters.
    with pytest.raises(StorageURLError, match="not a GCS bucket name"):
        AsyncCheckpointer("gs://b/x")
    assert list(tmp_path.iterdir()) == []  # no local "az:" or "gs:" directory
    assert AsyncCheckpointer(tmp_path / "local").options.mode == "rename"


# -- failures of the store -----------------------------------------------------------


@pytest.mark.parametrize("server_kind", ["moto", "seaweedfs"])
def test_wrong_credentials_are_named(server_kind, tmp_path, monkeypatch):
    """moto checking credentials, and SeaweedFS, which checks every signature."""
    server = S3Server(check_credentials=True) if server_kind == "moto" else SeaweedServer()
    with server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        if server_kind == "seaweedfs":
            server.create_bucket("any-bucket")
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        else:
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
