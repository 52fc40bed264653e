"""Checkpoints on object stores: the same tests against three real servers on 127.0.0.1.

moto (S3, in memory), SeaweedFS (a real S3 server, storing files, checking
signatures) and fake-gcs-server (GCS's JSON API, ``gs://`` roots): real JAX
processes save to and restore from each through tensorstore; the readers (layout,
journal, inventory, fsck, retention, the server routes of the sidebar) run here
against the same bucket. What only one store can show is in ``test_s3.py`` (throttling
through a fault proxy, wrong keys) and ``test_gcs.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nbckpt import storage
from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import CheckpointError, RenameUnavailableError
from nbckpt.formats import inventory
from nbckpt.formats.fsck import fsck
from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE, all_steps, entry_state, latest_step
from nbckpt.journal import SUMMARY_FILE, list_operations, read_operation
from nbckpt.procgroup import ProcessGroup
from nbckpt.protocol import PHASES
from nbckpt.storage import ObjectPath
from tests.ckpt_fixtures import api_get
from tests.conftest import _ENV
from tests.objectstores import KINDS, Store, keys

pytestmark = pytest.mark.multihost
T = "tests.mh_s3"


@pytest.fixture(scope="module", params=KINDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    kind = request.param
    started = Store(kind)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def root(store: Store, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with this process's environment pointing at the store."""
    for key, value in store.env().items():
        monkeypatch.setenv(key, value)
    return store.new_root()


def _op_keys(root: str, op: str, wait_s: float = 30.0) -> list[str]:
    """The keys of an operation's journal folder once the summary is there (or not)."""
    folder = storage.location(root) / ".nbckpt" / "ops" / op
    assert isinstance(folder, ObjectPath)
    deadline = time.monotonic() + wait_s
    while True:
        found = sorted(folder.list_keys())
        if found == [SUMMARY_FILE] or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _step_bytes(root: str, step: int) -> dict[str, bytes]:
    prefix = f"{step}/"
    return {
        k: (storage.location(root) / k).read_bytes() for k in keys(root) if k.startswith(prefix)
    }


# -- 4 processes save, 2 restore -----------------------------------------------------


def test_save_4_restore_2_bit_for_bit(group4, group2, store, root):
    env = store.env()
    out = group4.run(f"{T}:save", env, root, 1)
    assert [o["error"] for o in out] == [None] * 4
    # Commit-object mode was chosen for the bucket, without asking.
    assert {o["mode"] for o in out} == {"commit_file"}
    found = keys(root)
    assert f"1/{COMMIT_FILE}" in found and f"1/{METADATA_FILE}" in found
    assert not any(".nbckpt-tmp" in k for k in found)
    # Nothing was written locally under a directory named after the URL.
    assert not Path(f"{store.scheme}:").exists()
    assert all_steps(root) == [1] and latest_step(root) == 1
    assert entry_state(storage.location(root) / "1") == "complete"
    assert group2.run(f"{T}:restore_check", env, root, 1, 1) == [[], []]
    assert group4.run(f"{T}:restore_check", env, root, None, 1) == [[]] * 4


def test_journal_and_views_read_from_the_bucket(group2, store, root):
    env = store.env()
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
    assert _op_keys(root, ops[0]) == [SUMMARY_FILE]
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


def test_retention_deletes_only_old_steps_there(group2, store, root):
    env = store.env()
    for step in (1, 2, 3):
        out = group2.run(f"{T}:save", env, root, step, kwargs={"max_to_keep": 2})
        assert [o["error"] for o in out] == [None, None]
    assert all_steps(root) == [2, 3]
    assert not any(k.startswith("1/") for k in keys(root))
    assert group2.run(f"{T}:restore_check", env, root, 2, 2) == [[], []]


def test_a_committed_step_is_never_replaced_in_place(group2, store, root):
    env = store.env()
    group2.run(f"{T}:save", env, root, 1)
    before = _step_bytes(root, 1)
    out = group2.run(f"{T}:save", env, root, 1, kwargs={"force": True})
    assert {o["type"] for o in out} == {"CommitRefusedError"}
    assert "object stores have no rename" in out[0]["error"]
    assert _step_bytes(root, 1) == before
    assert group2.run(f"{T}:restore_check", env, root, 1, 1) == [[], []]


def test_rename_mode_is_refused(store, root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = root.split("/runs/")[0]
    with pytest.raises(RenameUnavailableError, match=f"rename mode is not available at {url}"):
        AsyncCheckpointer(root, mode="rename")
    assert list(tmp_path.iterdir()) == []  # no local "s3:" or "gs:" directory
    assert AsyncCheckpointer(root).options.mode == "commit_file"


# -- a process killed at each phase --------------------------------------------------

# Every phase on moto; on the other stores the phases where different requests are in
# flight (the owner record, the arrays, the commit object).
_KILLS = [("moto", p) for p in PHASES] + [
    (kind, p)
    for kind in KINDS
    if kind != "moto"
    for p in ("prepare", "write", "barrier:commit_complete")
]


@pytest.mark.parametrize(("store", "phase"), _KILLS, indirect=["store"])
def test_killing_a_process_at_each_phase_leaves_no_partial_step(phase, store, root, tmp_path):
    env = store.env()
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
    assert f"2/{COMMIT_FILE}" not in keys(root)
    # fsck removes what the failed save left (its own, by the owner record), only that.
    step1 = _step_bytes(root, 1)
    report = fsck(root, clean=True)
    assert not any(k.startswith("2/") for k in keys(root)), report.table()
    assert _step_bytes(root, 1) == step1
    assert all_steps(root) == [1]


# -- failures of the store -----------------------------------------------------------


def test_missing_bucket_is_one_line_naming_the_url(group2, store):
    env = store.env()
    url = f"{store.scheme}://no-such-bucket/x"
    out = group2.run(f"{T}:save", env, url, 1)
    for o in out:
        assert o["type"] == "PeerFailedError", o
        assert "bucket 'no-such-bucket' does not exist" in o["error"], o
        assert url in o["error"] and "nothing was saved" in o["error"]
        assert "\n" not in o["error"]


def test_a_store_killed_mid_save_fails_the_save_in_one_line(store, monkeypatch, tmp_path):
    """The real server dies while the arrays are written: nothing hangs, nothing commits.

    A server of its own (the module's keeps serving the other tests); for GCS its
    objects live in files, so a server started again on them shows what was kept.
    """
    folder = tmp_path / "objects"
    folder.mkdir()
    own = Store(store.kind, folder=folder)
    try:
        for key, value in own.env().items():
            monkeypatch.setenv(key, value)
        root = own.new_root()
        state = {"w": np.arange(1 << 20, dtype=np.float32)}  # 4 MiB: written, not packed
        ck = AsyncCheckpointer(root)
        ck.save(1, state)
        ck.wait_until_finished()
        hooks.set_hook("write", lambda _phase: own.server.kill())
        t0 = time.monotonic()
        try:
            with pytest.warns(RuntimeWarning, match="cannot write journal"):
                ck.save(2, state)
                with pytest.raises(CheckpointError) as info:
                    ck.wait_until_finished()
        finally:
            hooks.clear_hooks()
        assert time.monotonic() - t0 < 90
        msg = str(info.value)
        assert "did not answer" in msg and root in msg and "\n" not in msg, msg
    finally:
        own.stop()
    if own.restartable:
        # The same objects served again, where they were: step 1 whole, step 2 never
        # committed.
        again = Store(store.kind, folder=folder, port=own.server.port)
        try:
            assert all_steps(root) == [1]
            assert COMMIT_FILE not in [p.name for p in (storage.location(root) / "2").iterdir()]
            restored = AsyncCheckpointer(root).restore(1)
            np.testing.assert_array_equal(np.asarray(restored["w"]), state["w"])
        finally:
            again.stop()


# -- the server routes (the sidebar's data) ------------------------------------------


@pytest.mark.parametrize("store", ["moto", "seaweedfs"], indirect=True)
async def test_server_routes_list_a_bucket_root_with_the_servers_credentials(
    jp_fetch, store, root, monkeypatch
):
    """The sidebar's routes over an S3 bucket (GCS's: test_gcs.py, where a missing
    bucket reads as empty)."""
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
    monkeypatch.delenv(store.credential_var)
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": root})
    assert code == 403 and "no credentials" in data["message"], data
    assert "if the store is not the cloud's (this server would ask " in data["message"], data
