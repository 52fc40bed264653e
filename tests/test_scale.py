"""The control plane at scale: the simulation harness, and what keeps it linear.

``nbckpt.sim`` runs simulated processes, each with a real client of one real
coordination service, through nbckpt's own heartbeats, barriers, preflight, save job,
journal and commit. Here it runs 12 of them over 3 OS processes (4 each), so that
every path between workers is taken; ``benchmarks/scale.py`` runs it at 1,024.
The units below check the parts that make it scale: process 0's silence report, the
host records read ahead or on demand, and the preflight decided by the primary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nbckpt.engine.save.agreement import decision_of, plan_digest
from nbckpt.engine.sync import beats
from nbckpt.engine.sync.barriers import InProcessClient, Synchronizer, wait_slice
from nbckpt.engine.sync.hostbook import AHEAD, HostBook
from nbckpt.formats.layout import is_complete, step_dir
from nbckpt.journal import JournalWriter, read_operation
from nbckpt.journal._writer import flush_interval
from nbckpt.server.manager import BadRequestError, CheckpointManager
from nbckpt.sim import Simulation
from nbckpt.storage import location
from nbckpt.views.monitor import view_state
from nbckpt.views.naming import NAMED
from nbckpt.views.timeline import timeline_view
from nbckpt.widgets.progress import ProgressWidget, rows_from_view
from nbckpt.widgets.text import render_text
from nbckpt.widgets.timeline import plot_timeline
from tests.journal_scripts import SAVE, write_script

SCALE = Path(__file__).resolve().parent.parent / "benchmarks" / "scale.py"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim") / "ckpt"
    with Simulation(12, root, per_worker=4) as s:
        yield s


@pytest.mark.multihost
def test_simulated_processes_meet_at_both_barriers_and_commit_a_save(sim):
    for kind in ("nbckpt", "service"):
        timing = sim.barrier(f"both-{kind}", kind=kind)
        assert timing.release_ms >= 0 and timing.spread_ms >= 0
    saved = sim.save(1)
    assert saved.errors == {}
    assert is_complete(step_dir(sim.root, 1))
    record = read_operation(sim.root, saved.op)
    assert sorted(record.processes) == list(range(12))
    assert {p.status for p in record.processes.values()} == {"committed"}


@pytest.mark.multihost
def test_a_simulated_death_is_named_by_every_survivor_and_nothing_commits(sim):
    lost = sim.save(2, victim=6)
    assert lost.named, lost.errors
    assert sorted(lost.errors) == [p for p in range(12) if p != 6]
    assert all("process 6 died" in e for e in lost.errors.values()), lost.errors
    assert not is_complete(step_dir(sim.root, 2))
    assert lost.detect_s is not None and lost.detect_s > 0


@pytest.mark.multihost
def test_scale_benchmark_prints_its_table_and_the_result_line(tmp_path):
    plot = tmp_path / "scale.png"
    cmd = [sys.executable, str(SCALE), "--processes", "2,6", "--per-worker", "3"]
    cmd += ["--reps", "1", "--dir", str(tmp_path), "--plot", str(plot)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    rows = [ln for ln in lines if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["2", "6"]
    assert all("not named" not in r for r in rows)
    pattern = (
        r"RESULT processes=6 barrier_ms=\d+\.\d\d service_barrier_ms=\d+\.\d\d "
        r"detect_s=\d+\.\d\d view_ms=\d+\.\d route_ms=\d+\.\d"
    )
    assert __import__("re").fullmatch(pattern, lines[-1]), lines[-1]
    assert plot.stat().st_size > 10_000


def test_the_wait_slice_grows_with_the_job_and_is_bounded():
    assert wait_slice(4) == wait_slice(200) == 0.2
    assert wait_slice(500) == 0.5
    assert wait_slice(1024) == wait_slice(100_000) == 1.0


def _beat_all(clients, silent=(), n_beats=1):
    views = [beats.beats_for(c.process_index, c.process_count, 0.01) for c in clients]
    for beat in range(1, n_beats + 1):
        for c in clients:
            if c.process_index not in silent:
                c.key_value_set(f"{beats.BEAT_KEY}/{c.process_index}", str(beat))
        for c, view in zip(clients, views, strict=True):
            if c.process_index not in silent:
                view.read(c, beat)
    return views


def test_process_0_reports_the_silent_ones_and_the_others_count_on():
    store = InProcessClient(0, 4)
    clients = [InProcessClient(i, 4, store=store) for i in range(4)]
    views = _beat_all(clients)
    time.sleep(0.05)  # past two beats of 0.01 s for process 2 alone
    for beat in (2, 3):
        for c, view in zip(clients, views, strict=True):
            if c.process_index != 2:
                c.key_value_set(f"{beats.BEAT_KEY}/{c.process_index}", str(beat))
                view.read(c, beat)
    report = json.loads(store.key_value_try_get(beats.REPORT_KEY))
    assert list(report["silent"]) == ["2"], report  # one record, naming only the silent
    assert views[1].silent(0.04) == [2]
    assert views[1].silent_for(2) >= 0.05
    assert views[1].silent_for(3) == 0.0  # not reported: not silent


def test_a_report_that_stops_changing_ages_process_0_only():
    store = InProcessClient(0, 3)
    clients = [InProcessClient(i, 3, store=store) for i in range(3)]
    views = _beat_all(clients)
    time.sleep(0.1)
    views[1].read(clients[1], 2)  # the same report again: process 0 has not beaten
    assert views[1].silent(0.05) == [0]
    assert views[1].silent_for(2) == 0.0


def test_a_process_that_left_is_reported_as_left():
    store = InProcessClient(0, 3)
    clients = [InProcessClient(i, 3, store=store) for i in range(3)]
    views = _beat_all(clients)
    clients[2].key_value_set(f"{beats.BEAT_KEY}/2", beats.LEFT)
    views[0].read(clients[0], 2)
    views[1].read(clients[1], 2)
    assert views[1].left(2) and 2 in views[1].silent(100.0)


def test_host_records_are_read_ahead_for_a_few_and_on_demand_for_the_rest():
    n = 40
    store = InProcessClient(0, n)
    books = [HostBook(p, n) for p in range(n)]
    for p, book in enumerate(books):
        book.set_own(f"h{p}", f"10.0.0.{p}", 1000 + p)
        book.beat(InProcessClient(p, n, store=store))
    for p, book in enumerate(books):
        book.beat(InProcessClient(p, n, store=store))
    book = books[10]
    assert book.ready()
    assert book.ahead() == [0, *range(11, 11 + AHEAD)]
    assert sorted(book.where(list(range(n)))) == [0, *range(10, 11 + AHEAD)]
    book.learn(InProcessClient(10, n, store=store), [30, 31])
    assert book.where([30, 31]) == {30: ("10.0.0.30", 1030), 31: ("10.0.0.31", 1031)}
    assert book.names()[31] == "h31 at 10.0.0.31"


def test_the_primary_decides_from_digests_and_names_one_host_per_name():
    plan = {"format": "nbckpt", "leaves": {"w": "float32[4] numpy"}}
    other = {"format": "orbax", "leaves": {"w": "float32[4] numpy"}}
    answers = {
        p: {"problem": {}, "host": f"h{p // 2}", "plan": plan_digest(other if p == 3 else plan)}
        for p in range(4)
    }
    answers[0].update(op="op-1", step=1)
    decision = decision_of(answers, 0)
    assert decision["hosts"] == ["h0", "h1"] and decision["host_of"] == [0, 0, 1, 1]
    assert sorted(decision["plans"].values()) == [[0, 1, 2], [3]]
    assert decision["problem"] is None and decision["op"] == "op-1"
    answers[2]["problem"] = {"kind": "root", "reason": "read-only"}
    assert decision_of(answers, 0)["problem"] == [2, {"kind": "root", "reason": "read-only"}]


def test_await_value_ends_when_a_peer_fails():
    store = InProcessClient(0, 2)
    waiter = Synchronizer(InProcessClient(1, 2, store=store), poll_s=0.02)
    failing = Synchronizer(InProcessClient(0, 2, store=store), poll_s=0.02)
    out: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.await_value("op", "decision", source=0, timeout_s=30)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=wait)
    t.start()
    failing.signal_failure("op", "disk on fire")
    t.join(10)
    assert not t.is_alive()
    assert "disk on fire" in str(out[0])


def test_a_view_of_many_processes_names_a_few_and_counts_the_rest(tmp_path):
    """40 processes; 30 at write_complete, 10 never come: each list names 8 at most."""
    n = 40
    view = _forty(tmp_path)
    record = read_operation(tmp_path, "op")
    first = view.processes[0]
    tmp_ready, waiting = first.barriers
    assert tmp_ready.waited_count == n - 1 and tmp_ready.waited_for == list(range(32, 40))
    assert waiting.waiting_count == 10 and waiting.waiting_for == list(range(30, 38))
    row = rows_from_view(view)[0]
    assert row["barriers"][1]["text"].endswith(
        "waiting for 30, 31, 32, 33, 34, 35, 36, 37 and 2 more"
    )
    wait = timeline_view(record)["processes"]["0"]["waits"]["barrier:tmp_ready"]
    assert len(wait["processes"]) == NAMED and wait["count"] == n - 1
    assert wait["label"] == "waited for 32, 33, 34, 35, 36, 37, 38, 39 and 31 more"
    open_wait = timeline_view(record)["processes"]["0"]["waits"]["barrier:write_complete"]
    assert (open_wait["processes"], open_wait["count"]) == (list(range(30, 38)), 10)


def _forty(tmp_path, failing=None):
    """A save of 40 processes: all at tmp_ready, 30 at write_complete (one may fail)."""
    n, t0 = 40, 1_700_000_000.0
    for p in range(n):
        j = JournalWriter(tmp_path, "op", p, "save", 1)
        j.emit("requested", t=t0, process_count=n, primary=0)
        j.emit("barrier_enter", t=t0 + 0.1 + p * 0.01, name="tmp_ready")
        j.emit("barrier_exit", t=t0 + 0.6, name="tmp_ready")
        if p < 30:
            j.emit("barrier_enter", t=t0 + 1.0 + p * 0.01, name="write_complete")
        if p == failing:
            j.emit("failed", t=t0 + 2, error="OSError: disk on fire", phase="write")
        j.close()
    return view_state(read_operation(tmp_path, "op"))


def test_text_of_many_processes_shows_the_job_and_the_few_that_matter(tmp_path):
    lines = render_text(_forty(tmp_path)).splitlines()
    assert lines[1] == (
        "30 of 40 at barrier:write_complete; waiting for 30, 31, 32, 33, 34, 35, 36, 37 and 2 more"
    )
    assert lines[2] == "phases: barrier:write_complete 30, snapshot 10"
    assert lines[3].startswith("tmp_ready: 40 arrived, 40 released; arrivals over 390 ms")
    assert lines[4].startswith("write_complete: 30 arrived, 0 released")
    assert lines[4].endswith("last: 29 (+290 ms), 28 (+280 ms), 27 (+270 ms), 26 (+260 ms)")
    meters = [ln.split(":")[0] for ln in lines[5:]]
    assert meters == [f"process {p}" for p in range(30, 38)]  # the missing, one row each


def test_a_failure_among_many_is_said_once_culprit_first(tmp_path):
    text = render_text(_forty(tmp_path, failing=35))
    lines = text.splitlines()
    assert lines[1] == "process 35 failed during write: OSError: disk on fire"
    assert text.count("disk on fire") == 1
    assert lines[5].startswith("process 35:")


def test_a_large_jobs_journal_puts_stay_near_a_thousand_a_second():
    assert flush_interval(4) == flush_interval(250) == 0.25
    assert flush_interval(2000) == 2.0
    # Each process of a 2,000-process job on an object store writes once in 2 s at most.
    writer = JournalWriter(location("s3://bucket/root"), "op", 3, "save", 1, 2000)
    assert writer._sink is not None and writer._sink.interval_s == 2.0


def test_the_widget_of_many_processes_sends_the_whole_and_the_few(tmp_path):
    view = _forty(tmp_path)
    widget = ProgressWidget(view, read_operation(tmp_path, "op"))
    assert widget.summary["headline"].startswith("30 of 40 at barrier:write_complete")
    assert [r["process"] for r in widget.rows] == widget.summary["notable"] == list(range(30, 38))
    assert sorted(widget.timeline["processes"]) == sorted(map(str, range(30, 38)))
    spread = widget.summary["barriers"][0]
    assert sum(spread["histogram"]) == 40 and spread["slowest"][0] == {"process": 39, "ms": 390.0}
    # The field under the summary asks for another process: its row and lane come too.
    widget.asked = 3
    assert [r["process"] for r in widget.rows] == [3, *range(30, 38)]
    assert sorted(widget.timeline["processes"]) == sorted(map(str, [3, *range(30, 38)]))
    widget.asked = 99  # no such process: nothing more
    assert [r["process"] for r in widget.rows] == list(range(30, 38))


def test_the_figure_of_many_processes_draws_lanes_for_the_few_that_matter(tmp_path):
    _forty(tmp_path)
    fig = plot_timeline(tmp_path, "op", theme="light")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"process {p}" for p in range(30, 38)]
    assert "30 of 40 at barrier:write_complete" in ax.get_title(loc="left")


def test_the_route_of_many_processes_answers_the_whole_and_opens_one_on_request(tmp_path):
    _forty(tmp_path / "root")
    manager = CheckpointManager(tmp_path)
    answer = manager.operation("root", "op")
    assert answer["summary"]["headline"].startswith("30 of 40 at barrier:write_complete")
    assert sorted(answer["processes"]) == sorted(answer["view"]["processes"])
    assert sorted(map(int, answer["processes"])) == list(range(30, 38))
    opened = manager.operation("root", "op", "3")
    assert "3" in opened["processes"] and "3" in opened["view"]["processes"]
    with pytest.raises(BadRequestError, match="not a process index"):
        manager.operation("root", "op", "three")
    small = CheckpointManager(tmp_path).operation
    write_script(tmp_path / "two", "op", SAVE)
    assert small("two", "op")["summary"] is None


@pytest.mark.multihost
def test_a_simulation_that_fails_to_start_leaves_no_worker_behind(tmp_path, monkeypatch):
    sim = Simulation(2, tmp_path / "root", per_worker=1)
    started: list = []

    def fail(command, timeout_s=600):
        started.extend(sim._procs)
        raise RuntimeError("the workers did not connect")

    monkeypatch.setattr(sim, "_all", fail)
    with pytest.raises(RuntimeError, match="did not connect"):
        sim.start()
    assert len(started) == 2 and all(p.poll() is not None for p in started)
