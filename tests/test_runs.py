"""``RunWatch``: every save of a root, one row each, newest first (scripted journals)."""

from __future__ import annotations

from nbckpt.journal import read_operation
from nbckpt.widgets.runs import RunWatch, run_row, runs_html, runs_text
from tests.journal_scripts import MB, SAVE, T0, failing_save, killed_save, write_script

OP1 = "20231114T221320.000000-save-1"
OP2 = "20231114T221330.000000-save-2"
OP3 = "20231114T221340.000000-save-3"
BARRIER_OP = "20231114T221335.000000-barrier-k1-after-save"


def test_a_committed_save_sums_up_over_its_processes(tmp_path):
    write_script(tmp_path, OP1, SAVE, step=1)
    row = run_row(read_operation(tmp_path, OP1))
    assert (row.step, row.status) == (1, "committed")
    assert row.by_status == {"committed": 2}
    assert (row.bytes_written, row.bytes_total) == (18 * MB, 18 * MB)
    assert row.blocking_s is not None and abs(row.blocking_s - 0.07) < 1e-6  # p1's snapshot
    assert row.duration_s() is not None and abs(row.duration_s() - 0.56) < 1e-6
    assert row.error is None


def test_rows_are_newest_first_saves_only_and_follow_a_save_as_it_grows(tmp_path):
    write_script(tmp_path, OP1, SAVE, step=1)
    write_script(tmp_path, BARRIER_OP, [(0, 0.0, "requested", {"process_count": 1})])
    write_script(tmp_path, OP2, SAVE, step=2, upto=0.20)  # mid-write
    watch = RunWatch(tmp_path)
    assert watch.poll()
    rows = watch.rows()
    assert [r.op for r in rows] == [OP2, OP1]  # the barrier is not a save
    assert rows[0].status == "running" and rows[0].phase == "write"
    assert rows[0].bytes_written == 5 * MB
    assert watch.running
    # Nothing new in the journal, but a save runs: its duration still needs redrawing.
    assert watch.poll() and watch.rows() == rows

    write_script(tmp_path, OP2, SAVE, step=2, after=0.20)
    write_script(tmp_path, OP3, failing_save(), step=3)
    assert watch.poll()
    rows = watch.rows()
    assert [(r.op, r.status) for r in rows] == [
        (OP3, "failed"),
        (OP2, "committed"),
        (OP1, "committed"),
    ]
    assert rows[0].error == "process 1: OSError: disk on fire (then process 0 gave up)"
    assert not watch.running


def test_limit_keeps_the_newest_and_nothing_new_is_no_redraw(tmp_path):
    for op, step in ((OP1, 1), (OP2, 2), (OP3, 3)):
        write_script(tmp_path, op, SAVE, step=step)
    watch = RunWatch(tmp_path, limit=2)
    assert watch.poll()
    assert [r.step for r in watch.rows()] == [3, 2]
    assert not watch.poll()  # all settled and nothing new


def test_a_killed_process_counts_as_dead_not_running(tmp_path):
    write_script(tmp_path, OP1, killed_save(), step=1)
    watch = RunWatch(tmp_path)
    watch.poll()
    (row,) = watch.rows()
    assert row.status == "failed"
    assert row.by_status == {"failed": 2, "dead": 1}
    assert not watch.running


def test_text_and_html_show_every_row_and_the_failure_line(tmp_path):
    write_script(tmp_path, OP1, SAVE, step=1)
    write_script(tmp_path, OP3, failing_save(), step=3)
    watch = RunWatch(tmp_path)
    watch.poll()
    text = runs_text(watch.rows(), now=T0 + 1)
    lines = text.splitlines()
    assert lines[0].split() == [
        "step",
        "started",
        "state",
        "written",
        "blocking",
        "took",
        "processes",
        "op",
    ]
    assert lines[1].split()[0] == "3" and "failed" in lines[1]
    # The id %ckpt_show takes is on the row.
    assert lines[1].split()[-1] == OP3
    assert lines[2].strip() == "process 1: OSError: disk on fire (then process 0 gave up)"
    assert lines[3].split()[0] == "1" and "2 committed" in lines[3]
    page = runs_html(watch.rows(), str(tmp_path), now=T0 + 1)
    assert page.count('<tr class="run"') == 2
    assert f'data-op="{OP3}" data-status="failed"' in page
    assert f'<td class="op"><code>{OP3}</code></td>' in page
    assert "process 1: OSError: disk on fire" in page
    assert runs_text([]) == "no saves yet"
