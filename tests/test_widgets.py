"""The progress widget's traits, the live updater and the timeline, from real journals."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from tornado.ioloop import IOLoop

from nbckpt.journal import read_operation
from nbckpt.views.monitor import JournalTailer
from nbckpt.widgets import ProgressWidget, TextProgress, plot_timeline, watch
from nbckpt.widgets.live import LiveUpdater
from nbckpt.widgets.text import render_text
from tests.journal_scripts import SAVE, failing_save, write_script

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _widget(root: Path, op: str) -> ProgressWidget:
    return ProgressWidget(JournalTailer(root, op).view())


def test_widget_of_a_committed_save(tmp_path):
    write_script(tmp_path, "op", SAVE)
    w = _widget(tmp_path, "op")
    assert (w.op, w.status) == ("op", "committed")
    assert "save of step 7" in w.title and "2 processes" in w.title
    assert [r["process"] for r in w.rows] == [0, 1]
    for r in w.rows:
        assert (r["status"], r["phase"], r["fraction"]) == ("committed", "committed", 1.0)
        assert [b["state"] for b in r["barriers"]] == ["released"] * 3
        assert r["error"] is None
    assert "finalize +500 ms (50 ms)" in w.rows[0]["end_text"]
    assert "committed +560 ms" in w.rows[1]["end_text"]
    assert "waited for 1" in w.rows[0]["barriers"][1]["text"]


def test_widget_of_a_save_in_progress(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.35)
    w = _widget(tmp_path, "op")
    assert w.status == "running"
    r0, r1 = w.rows
    assert r0["phase"] == "barrier:write_complete"
    last = r0["barriers"][-1]
    assert (last["name"], last["state"], last["waiting_for"]) == ("write_complete", "waiting", [1])
    assert last["text"] == "write_complete +300 ms, waiting for 1"
    assert (r1["phase"], r1["fraction"], r1["bytes_text"]) == ("write", 0.375, "2.9 MiB / 7.6 MiB")


def test_widget_of_a_failed_save_shows_each_error(tmp_path):
    write_script(tmp_path, "op", failing_save())
    w = _widget(tmp_path, "op")
    assert w.status == "failed"
    r0, r1 = w.rows
    assert r1["status"] == "failed" and r1["error"] == "OSError: disk on fire"
    assert r1["error_phase"] == "write" and "during write" in r1["end_text"]
    assert "process 1 failed" in r0["error"] and r0["barriers"][-1]["state"] == "failed"


def test_update_sends_only_what_changed_and_mimebundle_has_text(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.35)
    tailer = JournalTailer(tmp_path, "op")
    w = ProgressWidget(tailer.view())
    changes: list[str] = []
    w.observe(lambda c: changes.append(c["name"]), names=["rows", "status", "title", "op"])
    assert not w.update_from(tailer.view())
    write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.35])
    tailer.poll()
    assert w.update_from(tailer.view())
    assert sorted(changes) == ["rows", "status"]
    data, _meta = w._repr_mimebundle_()
    assert WIDGET_MIME in data
    assert data["text/plain"].splitlines()[0] == "save of step 7 (op): committed"
    assert "process 1: 100%" in data["text/plain"]


def test_widget_front_end_is_the_built_module():
    from nbckpt.widgets import progress

    w = ProgressWidget()
    # Built from labextension/src/widget/progress.ts by the package's build hook.
    assert progress.ESM_PATH.is_file()
    assert w._esm == progress.ESM_PATH.read_text()
    # One bundled module (esbuild writes its default export as `export { x as default }`).
    assert re.search(r"export\s*(default|\{[^}]*\bas default\b)", w._esm) and "render" in w._esm
    assert w._css == progress.CSS_PATH.read_text() and ".nbckpt-w-bar" in w._css


def test_text_progress_draws_one_tqdm_bar_per_process(tmp_path):
    import io

    write_script(tmp_path, "op", SAVE, upto=0.35)
    view = JournalTailer(tmp_path, "op").view()
    text = render_text(view)
    assert "process 0: 100%" in text and "waiting for 1" in text
    assert "process 1:  38%" in text and "write" in text
    out = io.StringIO()
    bars = TextProgress(out)
    bars.update(view)
    bars.close()
    assert "save 7 process 1:  38%" in out.getvalue()


def _grow_journal(root: Path, op: str, steps: list[float], pause_s: float) -> threading.Thread:
    def run() -> None:
        done = -1.0
        for upto in steps:
            write_script(root, op, [e for e in SAVE if done < e[1] <= upto])
            done = upto
            time.sleep(pause_s)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _observe(w: ProgressWidget) -> list[tuple[str, tuple[str, ...]]]:
    seen: list[tuple[str, tuple[str, ...]]] = []
    w.observe(
        lambda c: seen.append((threading.current_thread().name, tuple(r["phase"] for r in c.new))),
        names="rows",
    )
    return seen


def test_watch_follows_a_growing_journal_until_it_commits(tmp_path):
    writer = _grow_journal(tmp_path, "op", [0.005, 0.12, 0.35, 0.52, 0.6], pause_s=0.35)
    w = watch(tmp_path, "op", display=False, interval_s=0.05)
    seen = _observe(w)
    assert w.live is not None and w.live.join(20)
    writer.join()
    assert w.status == "committed"
    assert len(seen) >= 3, seen
    assert ("barrier:write_complete", "write") in [s[1] for s in seen]
    assert seen[-1][1] == ("committed", "committed")
    # Outside a kernel there is no loop: the polling thread applies the views.
    assert {s[0] for s in seen} == {"nbckpt-live"}
    # A finished journal needs no updater.
    assert watch(tmp_path, "op", display=False).live is None


@pytest.fixture
def loop():
    """A real tornado IOLoop in its own thread, standing in for the kernel's loop."""
    started = threading.Event()
    holder: dict[str, IOLoop] = {}

    def run() -> None:
        holder["loop"] = IOLoop()
        holder["loop"].add_callback(started.set)
        holder["loop"].start()

    thread = threading.Thread(target=run, name="kernel-loop", daemon=True)
    thread.start()
    assert started.wait(10)
    yield holder["loop"]
    holder["loop"].add_callback(holder["loop"].stop)
    thread.join(10)


def test_updates_go_through_the_loop_and_are_coalesced(tmp_path, loop):
    write_script(tmp_path, "op", SAVE, upto=0.35)
    w = ProgressWidget()
    seen = _observe(w)
    updater = LiveUpdater(JournalTailer(tmp_path, "op"), w.update_from, interval_s=0.05, loop=loop)
    updater.start()
    time.sleep(0.3)
    write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.35])
    assert updater.join(10)
    assert w.status == "committed"
    assert {s[0] for s in seen} == {"kernel-loop"}
    assert updater.applied_from_thread == 0
    assert updater.applied == len(seen) == 2


def test_a_busy_loop_does_not_freeze_the_view(tmp_path, loop):
    """While a cell runs, the kernel's loop is blocked; the thread applies the view."""
    write_script(tmp_path, "op", SAVE, upto=0.35)
    busy = threading.Event()
    loop.add_callback(lambda: (busy.set(), time.sleep(2.0)))
    assert busy.wait(5)
    w = ProgressWidget()
    seen = _observe(w)
    updater = LiveUpdater(
        JournalTailer(tmp_path, "op"), w.update_from, interval_s=0.05, loop=loop, busy_after_s=0.3
    )
    updater.start()
    time.sleep(0.6)
    assert seen and seen[0][0] == "nbckpt-live"  # applied although the loop was blocked
    write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.35])
    assert updater.join(10)
    assert w.status == "committed" and updater.applied_from_thread >= 1


def test_timeline_of_a_committed_save(tmp_path):
    write_script(tmp_path, "op", SAVE)
    png = tmp_path / "out" / "timeline.png"
    fig = plot_timeline(tmp_path, "op", save=png)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["process 0", "process 1"]
    gids = {c.get_gid() for c in ax.collections}
    for p in (0, 1):
        for phase in ("snapshot", "barrier:tmp_ready", "write", "barrier:write_complete"):
            assert f"{p}:{phase}" in gids
    assert "0:finalize" in gids and "1:finalize" not in gids
    lines = {ln.get_gid() for ln in ax.lines}
    assert {"release:tmp_ready", "release:write_complete", "release:commit_complete"} <= lines
    assert "blocking" in {p.get_gid() for p in ax.patches}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_timeline_of_a_failed_save_marks_the_error(tmp_path):
    write_script(tmp_path, "op", failing_save())
    fig = plot_timeline(read_operation(tmp_path, "op"))
    (ax,) = fig.axes
    assert {"failed:0", "failed:1"} <= {ln.get_gid() for ln in ax.lines}
    notes = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    assert notes["error:1"] == "write: OSError: disk on fire"
    assert notes["error:0"] == "barrier:write_complete: gave up: process 1 failed"
    failed = [c for c in ax.collections if c.get_gid() == "1:write"]
    red, green, _blue, _alpha = failed[0].get_edgecolor()[0]
    assert red > 0.7 and green < 0.3  # outlined in red
    assert "failed" in ax.get_title(loc="left")


def test_timeline_needs_an_op_with_a_root(tmp_path):
    with pytest.raises(ValueError, match="name the operation"):
        plot_timeline(tmp_path)


def test_show_and_timeline_magics_read_a_journal_without_any_cluster(tmp_path, capsys):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    from nbckpt.magics.commands import NbckptMagics

    magics = NbckptMagics(InteractiveShell.instance())  # as after a kernel restart
    write_script(tmp_path, "20261121T000001-save-7", failing_save())
    write_script(tmp_path, "20261121T000002-save-8", SAVE, step=8)
    magics.ckpt_show(f"--dir {tmp_path}")  # the newest operation
    assert capsys.readouterr().out.startswith("save of step 8 (20261121T000002-save-8): committed")
    magics.ckpt_status(f"20261121T000001-save-7 --dir {tmp_path}")
    out = capsys.readouterr().out
    # The failure once, its culprit first, then who gave up.
    assert "failed on process 1: OSError: disk on fire (then process 0 gave up)" in out
    assert out.count("disk on fire") == 1
    fig = magics.ckpt_timeline(f"20261121T000001-save-7 --dir {tmp_path} --save {tmp_path}/t.png")
    assert isinstance(fig, Figure) and (tmp_path / "t.png").stat().st_size > 0
    for line, message in [
        ("", "pass --dir"),
        (f"nope --dir {tmp_path}", "no operation 'nope'"),
        (f"--dir {tmp_path / 'empty'}", "no journaled operations"),
    ]:
        with pytest.raises(UsageError, match=message):
            magics.ckpt_timeline(line)
    doc = magics.ckpt_timeline.__doc__
    assert "--save FILE.png" in doc and "--dir" in doc
    assert "--quiet" in magics.ckpt_save.__doc__
