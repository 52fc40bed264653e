"""Build checkpoint roots by hand, the way the engine lays them out, without jax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nbckpt.formats.layout import COMMIT_FILE, FORMAT, METADATA_FILE, TMP_SUFFIX, write_owner
from nbckpt.journal import JournalWriter

LEAVES: list[dict[str, Any]] = [
    {"name": "params.w", "kind": "jax", "shape": [4, 4], "dtype": "float32"},
    {"name": "host", "kind": "numpy", "shape": [3], "dtype": "int64"},
    {"name": "step", "kind": "scalar", "value": 1},
]


def write_step(
    root: Path,
    step: int,
    *,
    mode: str = "rename",
    op: str | None = None,
    committed: bool = True,
    finalized: float = 1000.0,
    processes: int = 2,
    missing: tuple[str, ...] = (),
    metadata: str | None = None,
    suffix: str = "",
) -> Path:
    """Write a step directory: owner record, metadata, a ``.zarray`` per array, commit file."""
    d = root / f"{step}{suffix}"
    d.mkdir(parents=True)
    write_owner(d, op or "unknown-op", mode, step)  # type: ignore[arg-type]
    for leaf in LEAVES:
        if leaf["kind"] != "scalar" and leaf["name"] not in missing:
            (d / leaf["name"]).mkdir()
            (d / leaf["name"] / ".zarray").write_text("{}")
            (d / leaf["name"] / "0.0").write_bytes(b"\0" * 64)
    meta = {
        "format": FORMAT,
        "step": step,
        "mode": mode,
        "op": op,
        "process_count": processes,
        "time_finalized": finalized,
        "leaves": LEAVES,
    }
    (d / METADATA_FILE).write_text(json.dumps(meta) if metadata is None else metadata)
    if mode == "commit_file" and committed:
        (d / COMMIT_FILE).write_text(f"{op}\n")
    return d


def write_tmp(root: Path, step: int) -> Path:
    """A rename-mode temporary directory with one array created."""
    d = root / f"{step}{TMP_SUFFIX}"
    (d / "params.w").mkdir(parents=True)
    (d / "params.w" / ".zarray").write_text("{}")
    return d


def journal(
    root: Path,
    op: str,
    step: int,
    *,
    outcome: str = "committed",
    processes: int = 2,
    t0: float = 1000.0,
    kind: str = "save",
) -> None:
    """Journal a save of ``step``: ``committed``, ``failed`` or ``running``."""
    for p in range(processes):
        w = JournalWriter(root, op, p, kind, step)
        w.emit("requested", t=t0, process_count=processes)
        w.emit("snapshot_done", t=t0 + 0.1, bytes=64)
        w.emit("barrier_enter", t=t0 + 0.2, name="tmp_ready")
        w.emit("barrier_exit", t=t0 + 0.3, name="tmp_ready")
        w.emit("write_started", t=t0 + 0.3)
        if outcome == "failed" and p == 1:
            w.emit("failed", t=t0 + 0.5, error="KeyboardInterrupt: killed", phase="write")
        elif outcome != "running":
            w.emit("write_done", t=t0 + 0.6, bytes=64)
            if outcome == "committed":
                w.emit("committed", t=t0 + 0.8)
            else:
                w.emit("failed", t=t0 + 0.9, error="PeerFailedError: process 1 failed")
        w.close()


async def api_get(jp_fetch: Any, *parts: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """GET ``nbckpt/api/<parts>`` from the test's jupyter server: its status and JSON body."""
    from tornado.httpclient import HTTPClientError

    try:
        response = await jp_fetch("nbckpt", "api", *parts, **kwargs)
    except HTTPClientError as e:
        assert e.response is not None
        body = e.response.body
        return e.code, json.loads(body) if body else {}
    return response.code, json.loads(response.body)
