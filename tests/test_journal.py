import json

import pytest

from nbckpt.journal import JournalWriter, list_operations, merge_events, read_operation


def _events(process, *names, t0=100.0, **extra):
    out = []
    for i, name in enumerate(names):
        ev = {"t": t0 + i, "event": name, "kind": "save", "step": 3, "process": process}
        if name.startswith("barrier_"):
            name, _, bname = name.partition(":")
            ev["event"] = name
            ev["name"] = bname
        if ev["event"] == "requested":
            ev["process_count"] = 2
        ev.update(extra.get(ev["event"], {}))
        out.append(ev)
    return out


FULL = (
    "requested",
    "snapshot_done",
    "barrier_enter:tmp_ready",
    "barrier_exit:tmp_ready",
    "tmp_ready",
    "write_started",
    "write_done",
    "barrier_enter:write_complete",
    "barrier_exit:write_complete",
    "barrier_enter:commit_complete",
    "barrier_exit:commit_complete",
    "committed",
)


def test_merge_committed_operation_has_every_phase_per_process():
    rec = merge_events("op1", {0: _events(0, *FULL), 1: _events(1, *FULL, t0=100.5)})
    assert rec.status == "committed"
    assert rec.step == 3 and rec.kind == "save" and rec.process_count == 2
    assert rec.start == 100.0 and rec.end == 100.5 + len(FULL) - 1
    names = [p.name for p in rec.processes[1].phases]
    assert names == [
        "snapshot",
        "barrier:tmp_ready",
        "write",
        "barrier:write_complete",
        "barrier:commit_complete",
    ]
    write = rec.processes[1].phases[2]
    assert (write.start, write.end, write.status) == (105.5, 106.5, "done")


def test_merge_failed_process_closes_open_phase_with_failure():
    failing = _events(
        1,
        "requested",
        "snapshot_done",
        "write_started",
        "failed",
        failed={"error": "OSError: disk full"},
    )
    rec = merge_events("op", {0: _events(0, *FULL), 1: failing})
    assert rec.status == "failed"
    p1 = rec.processes[1]
    assert p1.status == "failed" and p1.error == "OSError: disk full"
    assert p1.phases[-1].name == "write" and p1.phases[-1].status == "failed"
    assert p1.phases[-1].end == 103.0


def test_merge_in_progress_leaves_phase_open():
    rec = merge_events(
        "op",
        {0: _events(0, "requested", "snapshot_done", "write_started", write_started={"bytes": 10})},
    )
    assert rec.status == "running" and rec.end is None
    assert rec.processes[0].phases[-1].status == "open"
    assert rec.processes[0].phases[-1].end is None


def test_missing_process_means_running():
    rec = merge_events("op", {0: _events(0, *FULL)})
    assert rec.process_count == 2
    assert rec.status == "running"


def test_bytes_progress_is_tracked():
    evs = _events(
        0,
        "requested",
        "snapshot_done",
        "write_started",
        "write_progress",
        "write_progress",
        snapshot_done={"bytes": 100},
    )
    evs[3]["bytes"] = 40
    evs[4]["bytes"] = 70
    rec = merge_events("op", {0: evs})
    assert rec.processes[0].bytes_total == 100
    assert rec.processes[0].bytes_written == 70


def test_writer_and_reader_round_trip(tmp_path):
    for p in (0, 1):
        w = JournalWriter(tmp_path, "20260101T000000.000000-save-3", p, "save", 3)
        w.emit("requested", process_count=2)
        w.emit("snapshot_done", bytes=8)
        w.emit("committed")
        w.close()
    # A torn last line (a process killed mid-write) is skipped, not fatal.
    path = tmp_path / ".nbckpt/ops/20260101T000000.000000-save-3/process_1.jsonl"
    with open(path, "a") as f:
        f.write('{"t": 1, "ev')
    assert list_operations(tmp_path) == ["20260101T000000.000000-save-3"]
    rec = read_operation(tmp_path, "20260101T000000.000000-save-3")
    assert rec.status == "committed"
    assert set(rec.processes) == {0, 1}
    d = rec.to_dict()
    json.dumps(d)
    assert set(d["processes"]) == {"0", "1"}


def test_unknown_event_is_rejected(tmp_path):
    w = JournalWriter(tmp_path, "op", 0, "save", 1)
    with pytest.raises(ValueError, match="unknown journal event"):
        w.emit("bogus")


def test_unwritable_journal_warns_but_does_not_raise(tmp_path):
    (tmp_path / ".nbckpt").write_text("a file where a directory should be")
    w = JournalWriter(tmp_path, "op", 0, "save", 1)
    with pytest.warns(RuntimeWarning, match="cannot write journal"):
        w.emit("requested")
    w.emit("committed")  # stays quiet after the first warning


def test_read_missing_operation_names_known_ones(tmp_path):
    JournalWriter(tmp_path, "a-op", 0, "save", 1).emit("requested")
    with pytest.raises(FileNotFoundError, match="a-op"):
        read_operation(tmp_path, "nope")


# -- a committed save's summary (object stores) -----------------------------------------

OP = "20260101T000000.000000-save-3"


def _lines(events):
    return "".join(json.dumps(e) + "\n" for e in events)


def test_the_summary_stands_for_the_records_it_holds_and_a_process_record_wins(tmp_path):
    from nbckpt.journal import SUMMARY_FILE, JournalReader

    folder = tmp_path / ".nbckpt" / "ops" / OP
    folder.mkdir(parents=True)
    (folder / SUMMARY_FILE).write_text(_lines(_events(0, *FULL) + _events(1, *FULL[:-1])))
    rec = read_operation(tmp_path, OP)
    assert set(rec.processes) == {0, 1}
    assert rec.processes[0].events[-1]["event"] == "committed"
    assert [e["event"] for e in rec.processes[1].events][-1] == "barrier_exit"
    # A process's own record, written after (it is never older), replaces its copy.
    (folder / "process_1.jsonl").write_text(_lines(_events(1, *FULL)))
    rec = read_operation(tmp_path, OP)
    assert rec.status == "committed" and len(rec.processes[1].events) == len(FULL)
    # A reader that followed the records before they were gathered and deleted takes
    # the summary's longer copy, once, without counting any event twice.
    (folder / SUMMARY_FILE).unlink()
    (folder / "process_0.jsonl").write_text(_lines(_events(0, *FULL[:5])))
    reader = JournalReader(folder)
    assert reader.read() and len(reader.events[0]) == 5
    (folder / "process_0.jsonl").unlink()
    (folder / "process_1.jsonl").unlink()
    (folder / SUMMARY_FILE).write_text(_lines(_events(0, *FULL) + _events(1, *FULL)))
    assert reader.read()
    assert [len(reader.events[p]) for p in (0, 1)] == [len(FULL)] * 2
    assert not reader.read()  # read once: it does not change
    assert reader.merge(OP).status == "committed"


def test_a_record_gathered_while_it_is_listed_is_read_from_the_summary(tmp_path, monkeypatch):
    from nbckpt import storage
    from nbckpt.journal import SUMMARY_FILE

    folder = tmp_path / ".nbckpt" / "ops" / OP
    folder.mkdir(parents=True)
    (folder / SUMMARY_FILE).write_text(_lines(_events(0, *FULL) + _events(1, *FULL)))
    # The listing was taken before the summary was written and the records deleted.
    stale = [folder / "process_0.jsonl", folder / "process_1.jsonl"]
    monkeypatch.setattr(storage, "glob", lambda loc, pattern: list(stale))
    rec = read_operation(tmp_path, OP)
    assert sorted(rec.processes) == [0, 1] and rec.status == "committed"
