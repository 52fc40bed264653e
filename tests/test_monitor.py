"""The journal tailer and the per-process view, from journals written by the real writer."""

from __future__ import annotations

from pathlib import Path

from nbckpt.journal import read_operation
from nbckpt.views.monitor import JournalTailer, view_state
from tests.journal_scripts import MB, SAVE, T0, failing_save, write_script


def _view(root: Path, op: str):
    tailer = JournalTailer(root, op)
    assert tailer.poll()
    return tailer.view()


def test_committed_save(tmp_path):
    write_script(tmp_path, "op", SAVE)
    view = _view(tmp_path, "op")
    assert (view.status, view.kind, view.step, view.process_count) == ("committed", "save", 7, 2)
    p0, p1 = view.processes
    assert p0.phase == p1.phase == "committed"
    assert (p0.bytes_written, p0.bytes_total) == (10 * MB, 10 * MB)
    assert [b.name for b in p0.barriers] == ["tmp_ready", "write_complete", "commit_complete"]
    assert all(b.released is not None and not b.waiting_for for b in p0.barriers)
    # Process 0 arrived first at write_complete and waited for process 1.
    assert p0.barriers[1].waited_for == [1] and p1.barriers[1].waited_for == []
    assert p0.finalize == (T0 + 0.50, T0 + 0.55) and p1.finalize is None
    assert p0.committed == T0 + 0.56 and p0.error is None
    assert p0.barrier is None


def test_save_in_progress_names_whom_a_barrier_waits_for(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.35)
    view = _view(tmp_path, "op")
    assert view.status == "running" and view.end is None
    p0, p1 = view.processes
    assert p0.phase == "barrier:write_complete"
    assert p0.barrier is not None and p0.barrier.waiting_for == [1]
    assert p0.barrier.arrived == T0 + 0.30 and p0.barrier.released is None
    assert p1.phase == "write" and (p1.bytes_written, p1.bytes_total) == (3 * MB, 8 * MB)
    assert p1.barrier is None


def test_a_process_that_recorded_nothing_is_listed_as_not_started(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.07)
    p0, p1 = _view(tmp_path, "op").processes
    assert p0.phase == "barrier:tmp_ready" and p0.barrier.waiting_for == [1]
    assert p1.phase == "snapshot"
    write_script(tmp_path, "op2", SAVE, upto=0.005)
    view = _view(tmp_path, "op2")
    assert [p.status for p in view.processes] == ["running", "not started"]
    assert view.processes[0].phase == "snapshot"


def test_failed_save(tmp_path):
    write_script(tmp_path, "op", failing_save())
    view = _view(tmp_path, "op")
    assert view.status == "failed"
    p0, p1 = view.processes
    assert (p1.status, p1.phase, p1.error_phase) == ("failed", "failed", "write")
    assert p1.error == "OSError: disk on fire"
    assert p0.error_phase == "barrier:write_complete" and "process 1 failed" in p0.error
    assert p0.barrier is None  # it gave up: it no longer waits


def test_view_of_a_record_read_whole_equals_the_tailed_one(tmp_path):
    write_script(tmp_path, "op", failing_save())
    assert view_state(read_operation(tmp_path, "op")) == _view(tmp_path, "op")


def test_tailer_reads_only_new_complete_lines(tmp_path):
    tailer = JournalTailer(tmp_path, "op")
    assert not tailer.poll()  # no folder yet
    assert tailer.record().status == "running" and tailer.view().processes == []
    write_script(tmp_path, "op", SAVE, upto=0.10)
    assert tailer.poll()
    first = tailer.event_count
    assert not tailer.poll()  # nothing new
    assert tailer.event_count == first

    # A line being written (no newline yet) is kept back until it is complete.
    path = tmp_path / ".nbckpt" / "ops" / "op" / "process_1.jsonl"
    line = '{"t": %r, "event": "write_progress", "bytes": 123, "process": 1}\n' % (T0 + 0.2)
    with open(path, "a") as f:
        f.write(line[:20])
    assert not tailer.poll()
    with open(path, "a") as f:
        f.write(line[20:])
    assert tailer.poll() and tailer.event_count == first + 1
    assert tailer.view().processes[1].bytes_written == 123

    write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.10])
    assert tailer.poll()
    assert tailer.view().status == "committed"
    assert tailer.event_count == len(SAVE) + 1


def test_tailer_follows_the_first_operation_matching_a_glob(tmp_path):
    tailer = JournalTailer(tmp_path, "*-barrier-abc-sync")
    assert not tailer.poll()
    write_script(tmp_path, "20261121T000000-barrier-abc-sync", SAVE)
    assert tailer.poll()
    assert tailer.op == "20261121T000000-barrier-abc-sync"
