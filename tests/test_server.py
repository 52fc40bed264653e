"""The server routes: the manager directly, then every route through a real server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from nbckpt.server.manager import (
    BadRequestError,
    CheckpointManager,
    ForbiddenPathError,
    NotFoundError,
)
from tests.ckpt_fixtures import api_get, journal, write_step, write_tmp

OP_OK = "20260101T000000.000001-save-10"
OP_FAILED = "20260101T000000.000002-save-20"


def _prepare(root: Path) -> None:
    journal(root, OP_OK, 10)
    write_step(root, 10, op=OP_OK)
    journal(root, OP_FAILED, 20, outcome="failed")
    write_tmp(root, 20)


@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    root_dir = tmp_path / "server"
    _prepare(root_dir / "runs" / "ckpt")
    (tmp_path / "outside").mkdir()
    _prepare(tmp_path / "outside")
    os.symlink(tmp_path / "outside", root_dir / "escape")
    return root_dir


# --- the manager, without a server -------------------------------------------------


def test_manager_lists_states_and_operations(server_root: Path) -> None:
    m = CheckpointManager(server_root)
    data = m.checkpoints("runs/ckpt")
    assert data["root"] == "runs/ckpt"
    assert [(e["path"], e["state"]) for e in data["entries"]] == [
        ("10", "complete"),
        ("20.nbckpt-tmp", "abandoned"),
    ]
    assert data["counts"] == {"complete": 1, "abandoned": 1}
    ops = m.operations("runs/ckpt")["operations"]
    assert [(o["op"], o["status"]) for o in ops] == [(OP_FAILED, "failed"), (OP_OK, "committed")]
    one = m.operation("runs/ckpt", OP_OK)
    assert set(one["processes"]) == {"0", "1"}
    names = [p["name"] for p in one["processes"]["0"]["phases"]]
    assert names == ["snapshot", "barrier:tmp_ready", "write"]
    json.dumps(one)  # JSON-able as is


@pytest.mark.parametrize(
    ("root", "error"),
    [
        (None, BadRequestError),
        ("..", ForbiddenPathError),
        ("runs/../../outside", ForbiddenPathError),
        ("escape", ForbiddenPathError),
        ("/etc", ForbiddenPathError),
        ("~", ForbiddenPathError),
        ("nope", NotFoundError),
        ("runs/ckpt/10/_NBCKPT_METADATA", NotFoundError),
    ],
)
def test_manager_confines_roots(server_root: Path, root: str | None, error: type) -> None:
    with pytest.raises(error):
        CheckpointManager(server_root).checkpoints(root)


def test_manager_accepts_the_server_root_itself_and_inner_dotdot(server_root: Path) -> None:
    m = CheckpointManager(server_root)
    assert m.checkpoints("")["root"] == "."
    assert m.checkpoints("runs/../runs/ckpt")["root"] == "runs/ckpt"


def test_manager_refuses_a_journal_linked_outside(server_root: Path, tmp_path: Path) -> None:
    linked = server_root / "linked"
    linked.mkdir()
    os.symlink(tmp_path / "outside" / ".nbckpt", linked / ".nbckpt")
    m = CheckpointManager(server_root)
    for call in (m.checkpoints, m.operations):
        with pytest.raises(ForbiddenPathError):
            call("linked")
    with pytest.raises(ForbiddenPathError):
        m.operation("linked", OP_OK)
    # One operation folder linked out is refused too.
    ops = server_root / "runs" / "ckpt" / ".nbckpt" / "ops"
    os.symlink(tmp_path / "outside" / ".nbckpt" / "ops" / OP_OK, ops / "linked-op")
    with pytest.raises(ForbiddenPathError):
        m.operation("runs/ckpt", "linked-op")
    assert "linked-op" not in {o["op"] for o in m.operations("runs/ckpt")["operations"]}


def test_manager_protocol_is_the_protocol_module_as_json(tmp_path: Path) -> None:
    from nbckpt import protocol

    data = CheckpointManager(tmp_path).protocol()
    # as_json() as is, plus the kinds by member name while as_json() lacks them.
    assert data == {"kind_names": data["kind_names"], **protocol.as_json()}
    assert data["phases"] == list(protocol.PHASES)
    assert data["phase_names"]["write"] == protocol.Phase.WRITE
    assert data["statuses"]["running"] == protocol.Status.RUNNING
    assert data["kind_names"] == {k.name.lower(): k.value for k in protocol.Kind}
    assert data["barrier_prefix"] == protocol.BARRIER_PREFIX
    json.dumps(data)


@pytest.mark.parametrize("op", ["..", "../ckpt", "nope"])
def test_manager_refuses_bad_or_unknown_operations(server_root: Path, op: str) -> None:
    with pytest.raises((BadRequestError, NotFoundError)):
        CheckpointManager(server_root).operation("runs/ckpt", op)


# --- the routes, through a real jupyter server ----------------------------------------


@pytest.fixture
def jp_root_dir(server_root: Path) -> Path:
    return server_root


async def test_route_checkpoints(jp_fetch: Any) -> None:
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": "runs/ckpt"})
    assert code == 200
    states = {e["path"]: e["state"] for e in data["entries"]}
    assert states == {"10": "complete", "20.nbckpt-tmp": "abandoned"}
    complete = data["entries"][0]
    assert complete["process_count"] == 2 and complete["bytes"] > 0 and complete["op"] == OP_OK


async def test_route_operations_and_one_operation(jp_fetch: Any) -> None:
    code, data = await api_get(jp_fetch, "operations", params={"root": "runs/ckpt"})
    assert code == 200
    assert [o["op"] for o in data["operations"]] == [OP_FAILED, OP_OK]
    code, op = await api_get(jp_fetch, "operations", OP_FAILED, params={"root": "runs/ckpt"})
    assert code == 200
    assert op["status"] == "failed" and op["process_count"] == 2
    p1 = op["processes"]["1"]
    assert p1["status"] == "failed" and "KeyboardInterrupt" in p1["error"]
    assert [ph["status"] for ph in p1["phases"] if ph["name"] == "write"] == ["failed"]


async def test_route_protocol(jp_fetch: Any) -> None:
    from nbckpt import protocol

    code, data = await api_get(jp_fetch, "protocol")
    assert code == 200
    assert data["phases"] == list(protocol.PHASES)
    assert data["events"] == [e.value for e in protocol.Event]
    assert data["statuses"] == {s.name.lower(): s.value for s in protocol.Status}
    assert data["kind_names"]["save"] == protocol.Kind.SAVE
    assert data["spans"] == [[s, e, p] for s, e, p in protocol.SPANS]


@pytest.mark.parametrize(
    ("parts", "params", "code"),
    [
        (("checkpoints",), {}, 400),
        (("operations",), {}, 400),
        (("operations", OP_OK), {}, 400),
        (("checkpoints",), {"root": "../outside"}, 403),
        (("checkpoints",), {"root": "runs/../../outside"}, 403),
        (("checkpoints",), {"root": "escape"}, 403),
        (("operations",), {"root": "/tmp"}, 403),
        (("operations", OP_OK), {"root": "escape"}, 403),
        (("checkpoints",), {"root": "missing"}, 404),
        (("operations",), {"root": "missing"}, 404),
        (("operations", "no-such-op"), {"root": "runs/ckpt"}, 404),
    ],
)
async def test_route_refusals(
    jp_fetch: Any, parts: tuple[str, ...], params: dict[str, str], code: int
) -> None:
    got, data = await api_get(jp_fetch, *parts, params=params)
    assert got == code
    assert data["message"] and "\n" not in data["message"]
    # A refusal never leaks what lies outside the server's root.
    assert "entries" not in data and "processes" not in data


@pytest.mark.parametrize(
    "parts",
    [("checkpoints",), ("operations",), ("operations", OP_OK), ("protocol",)],
    ids=str,
)
async def test_routes_refuse_unauthenticated_requests(
    jp_fetch: Any, parts: tuple[str, ...]
) -> None:
    code, _ = await api_get(
        jp_fetch, *parts, params={"root": "runs/ckpt"}, headers={"Authorization": ""}
    )
    assert code == 403


@pytest.mark.parametrize(
    ("path", "code"),
    [
        # An encoded slash reaches the handler as part of the id: refused as malformed.
        ("operations/..%2F..%2Fescape%2Fops?root=runs%2Fckpt", 400),
        ("operations/..?root=runs%2Fckpt", 400),
        # Plain ``..`` segments match no route at all.
        ("operations/../../escape?root=runs%2Fckpt", 404),
        ("checkpoints?root=..%2F..%2F", 403),
    ],
)
async def test_route_refuses_traversal_in_the_url(
    http_server_client: Any, jp_auth_header: dict[str, str], jp_base_url: str, path: str, code: int
) -> None:
    url = f"{jp_base_url.rstrip('/')}/nbckpt/api/{path}"
    with pytest.raises(HTTPClientError) as info:
        await http_server_client.fetch(url, headers=jp_auth_header)
    assert info.value.code == code
    body = info.value.response.body if info.value.response is not None else b""
    assert b"KeyboardInterrupt" not in body and b"process_" not in body


def test_typescript_spells_no_protocol_word() -> None:
    """The lab extension and the widget get every protocol word from the server."""
    import re

    from nbckpt.protocol import as_json

    data = as_json()
    words = {data["barrier_prefix"], *data["phases"], *data["barriers"], *data["events"]}
    words |= {*data["statuses"].values(), *data["phase_names"].values()}
    words |= {*data["kinds"], *data["causes"], *data["modes"]}
    sources = sorted((Path(__file__).parents[1] / "labextension" / "src").rglob("*.ts"))
    assert len(sources) >= 6
    found = [
        f"{path.name}: {m.group(0)}"
        for path in sources
        for word in words
        for m in re.finditer(rf"(['\"`]){re.escape(word)}\1", path.read_text())
    ]
    assert found == []


def test_extension_entry_points_are_on_the_top_level_package() -> None:
    import nbckpt

    assert nbckpt._jupyter_server_extension_points() == [{"module": "nbckpt"}]
    assert nbckpt._jupyter_labextension_paths() == [{"src": "labextension", "dest": "nbckpt"}]
    assert callable(nbckpt._load_jupyter_server_extension)
    assert not {n for n in nbckpt.__all__ if n.startswith("_jupyter")}


def test_importing_nbckpt_does_not_import_the_server() -> None:
    import subprocess
    import sys

    code = (
        "import nbckpt, sys; print([m for m in ('tornado', 'jupyter_server') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
