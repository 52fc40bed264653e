"""Which roots the sidebar offers, absolute roots, and what runs in the clusters' roots.

The manager directly first (absolute roots, the scan, the running clusters' records and
their activity), then the two routes through a real server, then a real
``%ckpt_cluster start --dir`` that registers its root and ``stop`` that removes it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nbckpt.journal import JournalWriter
from nbckpt.protocol import barrier_op_id, new_op_id
from nbckpt.server.manager import CheckpointManager, ForbiddenPathError
from nbckpt.server.roots import is_root, running_clusters, scan
from nbckpt.session.cluster import JaxCluster, clusters_dir
from tests.ckpt_fixtures import api_get, journal, write_step, write_tmp

OP_OLD = "20260101T000000.000001-save-10"


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Jupyter runtime folder of the test's own, where clusters register their roots."""
    folder = tmp_path / "runtime"
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    """A server root: one nbckpt root deep down, decoys, and a link outside."""
    root_dir = tmp_path / "server"
    journal(root_dir / "notebooks" / "runs" / "ckpt", OP_OLD, 10)
    write_step(root_dir / "notebooks" / "runs" / "ckpt", 10, op=OP_OLD)
    (root_dir / "notebooks" / "data" / "2024").mkdir(parents=True)  # numbered, no records
    (tmp_path / "outside").mkdir()
    journal(tmp_path / "outside", OP_OLD, 10)
    os.symlink(tmp_path / "outside", root_dir / "escape")
    return root_dir


def _register(root: str | Path, cluster_id: str = "c1") -> JaxCluster:
    """Register ``root`` as the real code does, for a cluster that is not started."""
    cluster = JaxCluster(cluster_id=cluster_id)
    assert cluster.register_root(str(root)) is not None
    return cluster


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


# --- absolute roots -------------------------------------------------------------------


def test_absolute_roots_under_the_server_root_are_accepted(
    server_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = CheckpointManager(server_root)
    absolute = server_root / "notebooks" / "runs" / "ckpt"
    assert m.checkpoints(str(absolute))["root"] == "notebooks/runs/ckpt"
    assert m.operations(f"  {absolute}/ ")["operations"][0]["op"] == OP_OLD
    assert m.operation(str(absolute), OP_OLD)["root"] == "notebooks/runs/ckpt"
    assert m.checkpoints(str(server_root))["root"] == "."
    monkeypatch.setenv("HOME", str(server_root / "notebooks"))
    assert m.checkpoints("~/runs/ckpt")["root"] == "notebooks/runs/ckpt"


@pytest.mark.parametrize("where", ["outside", "server/escape", "server/../outside"])
def test_absolute_roots_elsewhere_are_refused_with_the_server_root_named(
    server_root: Path, tmp_path: Path, where: str
) -> None:
    with pytest.raises(ForbiddenPathError) as info:
        CheckpointManager(server_root).checkpoints(str(tmp_path / where))
    message = str(info.value)
    assert "outside the server's root" in message and str(server_root) in message
    assert "\n" not in message


# --- the scan ---------------------------------------------------------------------------


def test_is_root_by_journal_temporary_step_or_records(tmp_path: Path) -> None:
    journal(tmp_path / "journal_only", OP_OLD, 10)
    write_tmp(tmp_path / "tmp_only", 3)
    write_step(tmp_path / "step_only", 4)
    (tmp_path / "plain" / "1" / "x").mkdir(parents=True)  # a numbered folder is no step
    (tmp_path / "plain" / "7.nbckpt-tmpx").mkdir()
    os.symlink(tmp_path / "journal_only" / ".nbckpt", tmp_path / "linked_journal")
    (tmp_path / "via_link").mkdir()
    os.symlink(tmp_path / "journal_only" / ".nbckpt", tmp_path / "via_link" / ".nbckpt")
    assert is_root(tmp_path / "journal_only")
    assert is_root(tmp_path / "tmp_only")
    assert is_root(tmp_path / "step_only")
    assert not is_root(tmp_path / "plain")
    assert not is_root(tmp_path / "via_link")
    assert not is_root(tmp_path / "missing")


def test_is_root_for_a_root_orbax_wrote(tmp_path: Path) -> None:
    import numpy as np
    import orbax.checkpoint as ocp

    ckptr = ocp.StandardCheckpointer()
    ckptr.save((tmp_path / "orbax_run" / "7").absolute(), {"x": np.arange(4.0)})
    ckptr.wait_until_finished()
    assert is_root(tmp_path / "orbax_run")
    assert scan(tmp_path).roots == [tmp_path / "orbax_run"]


def test_scan_finds_roots_within_its_bounds(server_root: Path) -> None:
    deep = server_root / "a" / "b" / "c" / "d" / "e" / "run"
    journal(deep, OP_OLD, 10)
    journal(server_root / ".hidden" / "run", OP_OLD, 10)
    journal(server_root / "node_modules" / "run", OP_OLD, 10)
    (server_root / "venv").mkdir()
    (server_root / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    journal(server_root / "venv" / "run", OP_OLD, 10)
    ckpt = server_root / "notebooks" / "runs" / "ckpt"
    journal(ckpt / "10" / "nested", OP_OLD, 10)  # inside a root: its steps are not searched

    found = scan(server_root, max_depth=4)
    assert found.roots == [ckpt]
    assert found.truncated  # a/b/c/d/e lies deeper than 4
    assert scan(server_root, max_depth=6).roots == [ckpt, deep]
    # Out of time or directories: what was found so far, marked as cut short.
    assert scan(server_root, budget_s=0.0) == type(found)([], True)
    assert scan(server_root, max_dirs=1).truncated
    # The link to a root outside is not followed.
    assert not any("escape" in str(p) for p in scan(server_root, max_depth=9).roots)


# --- running clusters and what runs in their roots --------------------------------------


def test_a_cluster_registers_its_root_and_stop_removes_it(server_root: Path, runtime: Path) -> None:
    root = server_root / "notebooks" / "runs" / "ckpt"
    cluster = _register(root, cluster_id="17-a/b")
    [path] = list((runtime / "nbckpt" / "clusters").glob("*.json"))
    assert path.parent == clusters_dir()
    assert path.name == f"{os.getpid()}-17-a_b.json"
    record = json.loads(path.read_text())
    assert record["root"] == str(root) and record["pid"] == os.getpid()
    assert record["cluster_id"] == "17-a/b" and abs(record["time"] - time.time()) < 60
    [seen] = running_clusters()
    assert seen.root == str(root) and seen.cluster_id == "17-a/b"
    # Registering again replaces the record; None registers nothing.
    cluster.register_root(str(server_root))
    assert [r.root for r in running_clusters()] == [str(server_root)]
    cluster.register_root(None)
    assert running_clusters() == []
    cluster.register_root(str(root))
    cluster.stop()
    assert running_clusters() == [] and not path.exists()


def test_records_of_dead_or_foreign_processes_are_ignored(runtime: Path) -> None:
    folder = runtime / "nbckpt" / "clusters"
    folder.mkdir(parents=True)
    base = {"root": "/r", "profile": None, "cluster_id": "x", "time": 1.0}
    host = socket.gethostname()
    (folder / "1-dead.json").write_text(json.dumps({**base, "pid": _dead_pid(), "host": host}))
    other = {**base, "pid": os.getpid(), "host": host + "-elsewhere"}
    (folder / "2-other.json").write_text(json.dumps(other))
    (folder / "3-torn.json").write_text('{"root": "/r", "pid": ')
    (folder / "4-list.json").write_text("[1, 2]")
    (folder / "5-alive.json").write_text(json.dumps({**base, "pid": os.getpid(), "host": host}))
    assert [(r.root, r.pid) for r in running_clusters()] == [("/r", os.getpid())]


def _journal_now(root: Path, op: str, outcome: str, kind: str = "save") -> None:
    step = 0 if kind == "barrier" else int(op.rsplit("-", 1)[1])
    journal(root, op, step, outcome=outcome, t0=time.time(), kind=kind)


def test_activity_counts_what_runs_and_failed_since_the_cluster_started(
    server_root: Path, runtime: Path
) -> None:
    root = server_root / "notebooks" / "runs" / "ckpt"
    journal(root, "20260101T000000.000002-save-11", 11, outcome="failed")  # before: not ours
    _register(root)
    running, failed, done = new_op_id("save", 30), new_op_id("save", 31), new_op_id("save", 32)
    _journal_now(root, running, "running")
    _journal_now(root, failed, "failed")
    _journal_now(root, done, "committed")
    _journal_now(root, barrier_op_id("k1", "sync"), "running", kind="barrier")
    m = CheckpointManager(server_root)

    [cluster] = m.activity()["clusters"]
    assert cluster["root"] == "notebooks/runs/ckpt" and cluster["path"] == str(root)
    assert cluster["openable"] and cluster["reason"] is None and cluster["pid"] == os.getpid()
    assert [(o["op"], o["step"], o["status"]) for o in cluster["in_flight"]] == [
        (running, 30, "running")
    ]
    assert [o["op"] for o in cluster["failed"]] == [failed]
    json.dumps(cluster)

    # The running save commits: it is no longer in flight (finished ones are cached).
    for p in range(2):
        w = JournalWriter(root, running, p, "save", 30)
        w.emit("write_done", t=time.time(), bytes=64)
        w.emit("committed", t=time.time())
        w.close()
    for _ in range(2):
        [cluster] = m.activity()["clusters"]
        assert cluster["in_flight"] == [] and [o["op"] for o in cluster["failed"]] == [failed]


def test_activity_of_roots_not_there_yet_outside_or_unreadable(
    server_root: Path, tmp_path: Path, runtime: Path
) -> None:
    _register(server_root / "later", "a")
    _register(tmp_path / "outside", "b")
    _register("s3://bucket/run", "c")
    m = CheckpointManager(server_root)
    later, outside, bucket = m.activity()["clusters"]
    assert later["root"] == "later" and later["openable"]
    assert later["reason"] == "nothing saved there yet"
    assert not outside["openable"] and "outside the server's root" in outside["reason"]
    assert outside["in_flight"] == [] and outside["failed"] == []  # never read
    assert bucket["root"] == "s3://bucket/run" and not bucket["openable"]
    assert bucket["reason"]


def test_roots_lists_clusters_first_then_what_the_scan_found(
    server_root: Path, runtime: Path
) -> None:
    journal(server_root / "other", OP_OLD, 10)
    _register(server_root / "notebooks" / "runs" / "ckpt")
    data = CheckpointManager(server_root).roots()
    assert data["server_root"] == str(server_root)
    assert [c["root"] for c in data["clusters"]] == ["notebooks/runs/ckpt"]
    assert data["found"] == [{"root": "other", "path": str(server_root / "other")}]
    assert data["truncated"] is False
    json.dumps(data)


# --- the routes -------------------------------------------------------------------------


@pytest.fixture
def jp_root_dir(server_root: Path) -> Path:
    return server_root


async def test_routes_roots_and_activity(jp_fetch: Any, server_root: Path) -> None:
    # The server's runtime folder is the one its kernels would register in.
    root = server_root / "notebooks" / "runs" / "ckpt"
    _register(root)
    _journal_now(root, new_op_id("save", 40), "running")
    code, data = await api_get(jp_fetch, "roots")
    assert code == 200
    assert [c["root"] for c in data["clusters"]] == ["notebooks/runs/ckpt"]
    assert data["found"] == []
    code, data = await api_get(jp_fetch, "activity")
    assert code == 200
    assert [o["step"] for o in data["clusters"][0]["in_flight"]] == [40]


async def test_route_checkpoints_takes_an_absolute_root(jp_fetch: Any, server_root: Path) -> None:
    absolute = str(server_root / "notebooks" / "runs" / "ckpt")
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": absolute})
    assert code == 200 and data["root"] == "notebooks/runs/ckpt"
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": "/etc"})
    assert code == 403 and "outside the server's root" in data["message"]


@pytest.mark.parametrize("route", ["roots", "activity"])
async def test_new_routes_refuse_unauthenticated_requests(jp_fetch: Any, route: str) -> None:
    code, _ = await api_get(jp_fetch, route, headers={"Authorization": ""})
    assert code == 403


# --- a real cluster registers its root --------------------------------------------------


@pytest.mark.multihost
def test_ckpt_cluster_start_registers_its_root_and_stop_removes_it(
    ip: Any, tmp_path: Path, runtime: Path
) -> None:
    root = tmp_path / "server" / "ckpt"
    ip.run_line_magic("ckpt_cluster", f"start -n 1 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    try:
        [record] = running_clusters()
        assert record.root == str(root) and record.pid == os.getpid()
        assert record.cluster_id == magics.cluster.cluster_id
        ip.run_cell_magic("px", "", "import numpy as np\nstate = {'a': np.arange(3)}")
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        [cluster] = CheckpointManager(tmp_path / "server").activity()["clusters"]
        assert cluster["root"] == "ckpt" and cluster["openable"]
        assert cluster["in_flight"] == [] and cluster["failed"] == []
    finally:
        if magics.cluster is not None:
            ip.run_line_magic("ckpt_cluster", "stop")
    assert running_clusters() == []
    assert (root / "1").is_dir()
