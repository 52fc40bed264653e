"""The view models Python computes once and the TypeScript side only draws.

The timeline's decisions (commit time, failure notes, barrier waits) and the
server's labels, and the generated TypeScript declarations that type them: a test
regenerates the file in memory and fails while the checked-in copy is stale.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from nbckpt.formats.inventory import Entry, _first_error
from nbckpt.journal import PhaseSpan, read_operation
from nbckpt.protocol import BarrierState, Status, as_json
from nbckpt.protocol import typescript as gen
from nbckpt.session.handles import _failure
from nbckpt.views.answers import checkpoints_answer, entry_answer
from nbckpt.views.monitor import view_state
from nbckpt.views.timeline import commit_time, failure_note, timeline_view
from nbckpt.widgets.progress import rows_from_view, timeline_of
from nbckpt.widgets.text import render_text
from tests.journal_scripts import SAVE, T0, failing_save, killed_save, write_script

SRC = Path(__file__).resolve().parents[1] / "labextension" / "src"


def test_generated_typescript_is_current() -> None:
    """Run `python -m nbckpt.protocol.typescript` when this fails."""
    assert gen.OUTPUT.read_text() == gen.render()
    assert gen.main(["--check"]) == 0


def test_generated_typescript_types_every_field_sent(tmp_path: Path) -> None:
    text = gen.render()
    for word in (*Status, *BarrierState):
        assert f"'{word}'" in text
    assert "'foreign'" in text  # the inventory's states, all of them
    # Each key the timeline view sends is a field of its interface.
    write_script(tmp_path, "op", SAVE)
    view = timeline_view(read_operation(tmp_path, "op"))
    for key in (*view, *view["processes"]["0"]):
        assert re.search(rf"^  {key}: ", text, re.M), key


def test_hand_written_typescript_retypes_no_answer() -> None:
    """The server's answers are typed once, in the generated file."""
    for path in [*SRC.glob("*.ts"), *SRC.glob("widget/*.ts")]:
        text = path.read_text()
        assert "'orbax'" not in text, path.name
        for name in ("IEntry", "ICheckpoints", "IOperationSummary", "IClusterRoot", "IRow"):
            assert not re.search(rf"^export interface {name}\b", text, re.M), (path.name, name)


def test_commit_time_is_the_earliest_finalize_end(tmp_path: Path) -> None:
    write_script(tmp_path, "op", SAVE)
    record = read_operation(tmp_path, "op")
    assert commit_time(record) == T0 + 0.55
    # Were two processes to finalize, the step was complete at the first end.
    late = PhaseSpan("finalize", T0 + 0.5, T0 + 0.9, Status.DONE)
    record.processes[1].phases.insert(0, late)
    assert commit_time(record) == T0 + 0.55
    assert commit_time(replace(record, status=Status.FAILED)) is None


def test_failure_notes_and_barrier_waits_of_a_failed_save(tmp_path: Path) -> None:
    write_script(tmp_path, "op", failing_save())
    view = timeline_view(read_operation(tmp_path, "op"))
    assert view["commit_time"] is None
    p0, p1 = view["processes"]["0"], view["processes"]["1"]
    assert p1["failure"] == "OSError: disk on fire"
    assert p1["failed_at"] == T0 + 0.40
    assert p0["failure"] == "gave up: process 1 failed"  # the cause is said once, on 1
    wait = p0["waits"]["barrier:write_complete"]
    assert wait == {
        "state": BarrierState.FAILED,
        "processes": [1],
        "count": 1,
        "label": "gave up on 1",
        "short": "on 1",
    }
    released = p0["waits"]["barrier:tmp_ready"]
    assert (released["state"], released["label"]) == (BarrierState.RELEASED, "waited for 1")
    assert json.loads(json.dumps(view)) == view


def test_a_dead_process_is_named_with_who_reports_it(tmp_path: Path) -> None:
    write_script(tmp_path, "op", killed_save())
    record = read_operation(tmp_path, "op")
    # The culprit's row says what the first survivor saw, once; the survivors' rows
    # say only whom they gave up on.
    assert failure_note(record, 2) == (
        "process 2 died (no heartbeat for 3.0 s) during barrier:write_complete (reported by 0, 1)"
    )
    assert failure_note(record, 0) == failure_note(record, 1) == "gave up: process 2 died"
    assert failure_note(record, 9) is None
    # Reported dead before it recorded anything: its row still says so.
    del record.processes[2]
    assert failure_note(record, 2) == f"{Status.DEAD}: recorded nothing"


def test_the_widget_sends_the_same_view_as_the_server(tmp_path: Path) -> None:
    write_script(tmp_path, "op", failing_save())
    record = read_operation(tmp_path, "op")
    assert timeline_of(record)["view"] == timeline_view(record)
    rows = rows_from_view(view_state(record))
    chips = {c["state"] for r in rows for c in r["barriers"]}
    assert chips <= set(as_json()["barrier_states"].values())
    assert {r["fill_kind"] for r in rows} == {"write"}


def test_an_orbax_entry_is_labelled_by_the_server() -> None:
    entry = Entry(7, "7", "complete", "ok", 10, 0.0, None, None, None, format="orbax")
    assert entry_answer(entry)["format_label"] == "Orbax"
    own = replace(entry, format="nbckpt", step=8, path="8")
    assert entry_answer(own)["format_label"] is None
    answer = checkpoints_answer("r", 1.0, iter([entry, own]))
    assert answer["counts"] == {"complete": 2}
    assert [e["step"] for e in answer["entries"]] == [7, 8]


def _fields(text: str, interface: str) -> set[str]:
    """The fields of ``interface`` in the generated declarations, those it extends included."""
    m = re.search(
        rf"^export interface {interface}(?: extends (\w+))? \{{\n(.*?)^\}}", text, re.M | re.S
    )
    assert m is not None, interface
    own = set(re.findall(r"^  (\w+)\??: ", m.group(2), re.M))
    return own | (_fields(text, m.group(1)) if m.group(1) else set())


def test_every_key_the_server_sends_is_typed(tmp_path: Path) -> None:
    from nbckpt.server.manager import CheckpointManager

    text = gen.render()
    write_script(tmp_path / "root", "20260101T000000-save-3", SAVE)
    (tmp_path / "root" / "3").mkdir()
    manager = CheckpointManager(tmp_path)
    ops = manager.operations("root")
    assert set(ops) == _fields(text, "IOperations")
    assert set(ops["operations"][0]) == _fields(text, "IOperationSummary")
    one = manager.operation("root", "20260101T000000-save-3")
    assert set(one) == _fields(text, "IOperationAnswer")
    assert set(one["processes"]["0"]) == _fields(text, "IProcessRecord")
    listed = manager.checkpoints("root")
    assert set(listed) == _fields(text, "ICheckpoints")
    assert listed["entries"] and set(listed["entries"][0]) == _fields(text, "IEntryAnswer")
    assert set(manager.protocol()) == _fields(text, "IProtocolNames")
    assert set(manager.roots()) == _fields(text, "IRoots")


def test_a_death_is_said_once_with_its_culprit_first_everywhere(tmp_path: Path) -> None:
    # Issue 32's review: "failed on process 0: process 2 died" read as process 0's
    # fault, and the same sentence was printed under every survivor.
    write_script(tmp_path, "op", killed_save())
    record = read_operation(tmp_path, "op")
    said = "process 2 died (no heartbeat for 3.0 s) during barrier:write_complete"
    whole = f"{said} (then processes 0, 1 gave up)"
    assert _first_error(record) == f": {whole}"
    assert f"failed: {whole}; nothing was committed" in str(_failure(record, str(tmp_path)))
    text = render_text(view_state(record))
    assert f"failed: {whole}" in text and text.count("no heartbeat") == 1
    rows = rows_from_view(view_state(record))
    assert [r["error"] for r in rows] == ["gave up: process 2 died"] * 2 + [None]
    drawn = timeline_view(record)["processes"]
    assert [drawn[p]["failure"] for p in "01"] == ["gave up: process 2 died"] * 2
    assert drawn["2"]["failure"] == f"{said} (reported by 0, 1)"
