"""The live widget's timeline: its traits from real journals, and its one-file front end.

The browser side (the same timeline component as the lab sidebar's, drawn from these
traits) is checked in ``tests/browser/test_widget_in_lab.py``.
"""

from __future__ import annotations

import re
import threading
import time

from nbckpt.journal import read_operation
from nbckpt.protocol import as_json
from nbckpt.views.monitor import view_state
from nbckpt.widgets import ProgressWidget, progress, watch
from tests.journal_scripts import SAVE, failing_save, write_script


def _widget(root, op) -> ProgressWidget:
    record = read_operation(root, op)
    return ProgressWidget(view_state(record), record)


def test_timeline_is_the_merged_journal_with_now(tmp_path):
    write_script(tmp_path, "op", SAVE)
    before = time.time()
    w = _widget(tmp_path, "op")
    tl = w.timeline
    assert (tl["op"], tl["status"], tl["process_count"]) == ("op", "committed", 2)
    assert before <= tl["now"] <= time.time()
    phases = [p["name"] for p in tl["processes"]["0"]["phases"]]
    assert phases[:2] == ["snapshot", "barrier:tmp_ready"] and "finalize" in phases
    # The raw events stay in the kernel: the drawing needs only the phases.
    assert all("events" not in p for p in tl["processes"].values())
    # What the front end draws with comes from Python, never from a server.
    assert w.protocol == as_json()


def test_timeline_of_a_failed_save_carries_each_error(tmp_path):
    write_script(tmp_path, "op", failing_save())
    tl = _widget(tmp_path, "op").timeline
    assert tl["status"] == "failed"
    assert tl["processes"]["1"]["error"] == "OSError: disk on fire"
    failed = [p for p in tl["processes"]["1"]["phases"] if p["status"] == "failed"]
    assert [p["name"] for p in failed] == ["write"]


def test_update_sends_the_timeline_only_when_the_journal_changed(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.35)
    w = _widget(tmp_path, "op")
    sent: list[dict] = []
    w.observe(lambda change: sent.append(change.new), names="timeline")
    record = read_operation(tmp_path, "op")
    assert not w.update_from(view_state(record), record)  # same journal: nothing sent
    assert sent == []
    write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.35])
    record = read_operation(tmp_path, "op")
    assert w.update_from(view_state(record), record)
    assert [tl["status"] for tl in sent] == ["committed"]
    # Without a record (a barrier shown from the engines' times) the timeline stays.
    assert not w.update_from(view_state(record))
    assert w.timeline["status"] == "committed"


def test_a_widget_without_a_record_has_no_timeline(tmp_path):
    write_script(tmp_path, "op", SAVE)
    w = ProgressWidget(view_state(read_operation(tmp_path, "op")))
    assert w.timeline == {} and w.rows


def test_watch_grows_the_timeline_with_the_journal(tmp_path):
    write_script(tmp_path, "op", SAVE, upto=0.12)

    def finish() -> None:
        time.sleep(0.4)
        write_script(tmp_path, "op", [e for e in SAVE if 0.12 < e[1] <= 0.35])
        time.sleep(0.4)
        write_script(tmp_path, "op", [e for e in SAVE if e[1] > 0.35])

    writer = threading.Thread(target=finish)
    w = watch(tmp_path, "op", display=False, interval_s=0.05)
    statuses: list[tuple[str, int]] = []
    w.observe(
        lambda c: statuses.append(
            (c.new["status"], sum(len(p["phases"]) for p in c.new["processes"].values()))
        ),
        names="timeline",
    )
    assert w.timeline["status"] == "running"
    open_spans = [
        p for proc in w.timeline["processes"].values() for p in proc["phases"] if p["end"] is None
    ]
    assert open_spans  # what the front end grows to "now"
    writer.start()
    assert w.live is not None and w.live.join(20)
    writer.join()
    assert statuses and statuses[-1][0] == "committed"
    counts = [n for _, n in statuses]
    assert counts == sorted(counts) and len(counts) >= 2


def test_front_end_is_one_self_contained_module():
    # anywidget loads a single file: the shared timeline must be bundled into it.
    esm = progress.ESM_PATH.read_text()
    assert not re.search(r"^\s*import\b|\brequire\(", esm, flags=re.M)
    assert "nbckpt-timeline" in esm and "renderTimeline" in esm
    css = progress.CSS_PATH.read_text()
    assert "--nbckpt-write" in css and ".nbckpt-timeline" in css and ".nbckpt-w-bar" in css
