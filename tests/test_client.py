"""The client's own logic, without engines: failure reports, operation lookup, checks."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE, ops_dir, step_dir
from nbckpt.journal import merge_events
from nbckpt.session.client import CheckpointClient, SaveHandle
from nbckpt.session.handles import _failure
from nbckpt.session.operations import resolve_operation

OP = "20250101T000000.000000-save-5"


def _events(failed: dict[str, Any], t: float) -> list[dict[str, Any]]:
    head = {"kind": "save", "step": 5, "op": OP}
    return [
        {**head, "t": 0.0, "event": "requested", "process_count": 3},
        {**head, "t": t, "event": "failed", **failed},
    ]


def _record(failures: dict[int, dict[str, Any]]) -> Any:
    return merge_events(OP, {p: _events(f, t=1.0 + p / 10) for p, f in failures.items()})


def test_the_cause_is_read_from_data_not_from_the_wording(tmp_path):
    rec = _record(
        {
            # Its own error, although its text reads like a peer's failure.
            1: {"error": "process 3 failed to open the file", "cause": "error", "culprit": 1},
            # Gave up, in words no pattern would know.
            0: {"error": "a peer broke", "cause": "peer_failed", "culprit": 1},
            2: {"error": "waited in vain", "cause": "timeout", "culprit": 1},
        }
    )
    err = _failure(rec, str(tmp_path))
    assert str(err) == (
        f"save of step 5 ({OP}) failed on process 1: process 3 failed to open the file "
        "(then processes 0, 2 gave up); nothing was committed for this step"
    )
    assert err.processes == [0, 1, 2]


def test_failed_events_without_a_cause_count_as_own_errors(tmp_path):
    rec = _record({0: {"error": "OSError: a"}, 1: {"error": "OSError: a"}, 2: {"error": "B"}})
    assert "failed on processes 0, 1: OSError: a; process 2: B;" in str(_failure(rec, tmp_path))


def test_when_every_process_gave_up_the_culprit_leads_not_the_first_to_notice(tmp_path):
    # A student read "failed on process 0: process 2 died" as process 0's fault.
    dead = {"cause": "peer_dead", "culprit": 2}
    rec = _record(
        {1: {"error": "process 2 died (late)", **dead}, 0: {"error": "process 2 died", **dead}}
    )
    msg = str(_failure(rec, tmp_path))
    assert "failed: process 2 died (then processes 0, 1 gave up);" in msg
    assert "on process 0" not in msg


def test_a_failed_forced_resave_says_the_old_step_is_untouched(tmp_path):
    (step_dir(tmp_path, 5)).mkdir()
    (step_dir(tmp_path, 5) / COMMIT_FILE).write_text("")
    rec = _record(
        {
            0: {"error": "OSError: x", "cause": "error", "culprit": 0, "previous_kept": True},
            1: {"error": "peer", "cause": "peer_failed", "culprit": 0, "previous_kept": True},
        }
    )
    msg = str(_failure(rec, tmp_path))
    assert msg.endswith("; the previously committed step 5 is untouched")
    assert "nothing was committed" not in msg


def test_a_step_this_save_committed_is_reported_complete(tmp_path):
    path = step_dir(tmp_path, 5)
    path.mkdir()
    (path / COMMIT_FILE).write_text("")
    (path / METADATA_FILE).write_text(json.dumps({"op": OP}))
    rec = _record({1: {"error": "process 0 died", "cause": "peer_dead", "culprit": 0}})
    assert str(_failure(rec, tmp_path)).endswith(
        "had been committed before the failure and is complete on disk"
    )


def _journal(root: Any, *ops: str) -> None:
    for op in ops:
        (ops_dir(root) / op).mkdir(parents=True)


def test_resolve_operation_by_id_folder_directory_and_handle(tmp_path):
    ops = [f"20250101T00000{i}.000000-save-{i}" for i in range(5)]
    _journal(tmp_path, *ops)
    assert resolve_operation(None, str(tmp_path), None) == (str(tmp_path), ops[-1])
    assert resolve_operation(ops[1], str(tmp_path), None) == (str(tmp_path), ops[1])
    folder = ops_dir(tmp_path) / ops[2]
    assert resolve_operation(str(folder), None, None) == (str(tmp_path), ops[2])
    client = CheckpointClient(SimpleNamespace(), tmp_path)
    assert resolve_operation(ops[0], None, client) == (str(tmp_path), ops[0])
    assert resolve_operation(None, None, client) == (str(tmp_path), ops[-1])
    # The session's last save is not what "show me" means: the newest operation is
    # (the barrier, or the failed restore, that just happened).
    elsewhere = tmp_path / "elsewhere"
    _journal(elsewhere, "20250101T000002.000000-save-9")
    client.handles.append(
        SaveHandle("20250101T000002.000000-save-9", 9, str(elsewhere), [0.0], client)
    )
    assert resolve_operation(None, None, client) == (str(tmp_path), ops[-1])
    newer = "20250101T000009.000000-barrier-k-sync"
    _journal(elsewhere, newer)
    assert resolve_operation(None, None, client) == (str(elsewhere), newer)
    latest = ", ".join(ops[-3:])
    with pytest.raises(ValueError, match=rf"^no operation 'nope' in .*; latest: {latest}$"):
        resolve_operation("nope", str(tmp_path), None)


def test_resolve_operation_says_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="which checkpoint directory"):
        resolve_operation(None, None, None)
    with pytest.raises(ValueError, match="which checkpoint directory"):
        resolve_operation("op", None, CheckpointClient(SimpleNamespace()))
    with pytest.raises(ValueError, match="no journaled operations in"):
        resolve_operation(None, str(tmp_path), None)
    with pytest.raises(ValueError, match=r"latest: none$"):
        resolve_operation("op", str(tmp_path), None)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "soon", True])
def test_timeouts_are_checked_before_anything_is_sent(tmp_path, bad):
    # A cluster without a client: anything that reached the engines would fail apart.
    client = CheckpointClient(SimpleNamespace(engine_ids=[0, 1]), tmp_path)
    handle = SaveHandle("op", 1, str(tmp_path), [0.0], client)
    calls = [
        lambda: client.save("x", 1, timeout_s=bad),
        lambda: client.restore("x", timeout_s=bad),
        lambda: client.barrier("b", timeout_s=bad),
        lambda: client.wait(timeout_s=bad),
        lambda: handle.wait(timeout_s=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="timeout_s must be"):
            call()


def test_barrier_processes_must_name_someone(tmp_path):
    client = CheckpointClient(SimpleNamespace(engine_ids=[0, 1]), tmp_path)
    with pytest.raises(ValueError, match="processes is empty"):
        client.barrier("b", processes=[])
    with pytest.raises(ValueError, match="no process 2"):
        client.barrier("b", processes=[0, 2])


def test_numpy_and_jax_scalar_metrics_become_floats_before_they_are_sent():
    import jax.numpy as jnp
    import numpy as np

    from nbckpt.formats.retention import check_metrics  # what CheckpointClient.save sends

    given = {"a": np.float32(0.5), "b": jnp.float32(1.5), "c": jnp.array(2), "d": np.int64(3)}
    plain = check_metrics(given)
    assert plain == {"a": 0.5, "b": 1.5, "c": 2.0, "d": 3.0}
    assert all(type(v) is float for v in plain.values())
    # Not a scalar: named by the check.
    with pytest.raises(ValueError, match="'v' must be a finite number"):
        check_metrics({"v": np.ones(3)})


def test_processes_that_went_down_with_process_0_end_their_rows():
    """Process 1 reports process 0 dead; process 2 never writes again: no row stays running."""
    from nbckpt.views.monitor import settled, view_state

    head = {"kind": "save", "step": 3, "op": OP, "process_count": 3, "primary": 0}
    started = [{**head, "t": 1.0, "event": "requested"}, {"t": 1.1, "event": "snapshot_done"}]
    waiting = [*started, {"t": 1.3, "event": "barrier_enter", "name": "write_complete"}]
    reported = {"t": 5.0, "event": "failed", "cause": "peer_dead", "error": "x", "dead": [0]}
    rec = merge_events(OP, {0: started, 1: [*waiting, reported], 2: waiting})
    view = view_state(rec)
    rows = {p.process: p for p in view.processes}
    assert rows[0].status == "dead" and rows[2].status == "failed"
    assert "process 0" in (rows[2].error or "")
    assert view.status == "failed" and settled(view)
