"""What watching costs: a 1 GiB save with and without the live widget, and without a journal.

Run: ``.venv/bin/python benchmarks/widget_overhead.py [--gib 1] [--processes 4] [--reps 5]``

Four local JAX processes (one CPU device each) save a float32 state of the given size
into a fresh root, again and again, rotating through three modes:

- ``journal``: as shipped (every process journals its events), nobody watching;
- ``journal+widget``: the same, while this (parent) process follows the save the way a
  notebook does: a :class:`~nbckpt.views.monitor.JournalTailer` polled every 0.25 s by a
  :class:`~nbckpt.widgets.live.LiveUpdater` that feeds a real ``ProgressWidget``;
- ``no journal``: ``JournalWriter.emit`` replaced by a no-op inside the benchmark's
  own workers only, to price the journal itself.

Each figure is the median over repetitions of the slowest process's time from ``save``
to a durable commit (and of how long ``save`` blocked).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODES = ("journal", "journal+widget", "no journal")
_original_emit: Any = None


# -- inside the JAX processes ---------------------------------------------------------


def _w_journal(enabled: bool) -> None:
    """Turn this process's journal on or off (benchmark workers only)."""
    from nbckpt.journal import _writer

    global _original_emit
    if _original_emit is None:
        _original_emit = _writer.JournalWriter.emit

    def no_emit(self: Any, event: str, *, t: float | None = None, **fields: Any) -> None:
        return None

    setattr(_writer.JournalWriter, "emit", _original_emit if enabled else no_emit)  # noqa: B010


# -- parent ---------------------------------------------------------------------------


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _save(group: Any, root: Path, step: int, mode: str) -> dict[str, float]:
    from nbckpt.views.monitor import JournalTailer
    from nbckpt.widgets.live import LiveUpdater
    from nbckpt.widgets.progress import ProgressWidget

    group.run("widget_overhead:_w_journal", mode != "no journal")
    updater = None
    widget = ProgressWidget()
    cpu0 = _cpu_s()
    if mode == "journal+widget":
        tailer = JournalTailer(root, f"*-save-{step}")
        updater = LiveUpdater(tailer, widget.update_from, loop=None).start()
    res = group.run("engine_bench:_w_save", str(root), step)
    journals = root.glob(".nbckpt/ops/*/process_*.jsonl")
    events = sum(f.read_text().count("\n") for f in journals)
    updates = 0
    if updater is not None:
        updater.join(30)
        updates = updater.applied
        assert widget.status == "committed", widget.status
    return {
        "blocked": max(r["blocked"] for r in res),
        "commit": max(r["commit"] for r in res),
        "parent_cpu": _cpu_s() - cpu0,
        "updates": updates,
        "events": events,
    }


def _emit_cost_us(n: int = 20_000) -> float:
    """Microseconds per journal event (a ``write_progress`` line, flushed), this process."""
    from nbckpt.journal import JournalWriter

    with tempfile.TemporaryDirectory() as d:
        w = JournalWriter(d, "op", 0, "save", 1)
        w.emit("requested", process_count=1)
        t0 = time.perf_counter()
        for i in range(n):
            w.emit("write_progress", bytes=i)
        took = time.perf_counter() - t0
        w.close()
    return took / n * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE))
    from engine_bench import scratch_dir

    from nbckpt.procgroup import ProcessGroup

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args(argv)

    base = scratch_dir("nbckpt-widget-bench-", args.dir)
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        with ProcessGroup(args.processes, env=env) as group:
            nbytes = group.run("engine_bench:_w_build", int(args.gib * 2**30))[0]
            step = 0
            _save(group, base / "warmup", step, "journal")  # compiles, warms the page cache
            shutil.rmtree(base / "warmup")
            for rep in range(args.reps):
                # Rotate the order so that drift (page cache, disk) hits every mode alike.
                for mode in MODES[rep % 3 :] + MODES[: rep % 3]:
                    step += 1
                    root = base / f"s{step}"
                    # Start each save with no writeback of the previous one in flight.
                    os.sync()
                    results[mode].append(_save(group, root, step, mode))
                    shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    def best(mode: str) -> float:
        return min(r["commit"] for r in results[mode])

    print(
        f"nbckpt widget overhead: {nbytes / 2**30:.2f} GiB float32, {args.processes} "
        f"processes x 1 CPU device, {args.reps} reps per mode (slowest process)"
    )
    print(
        f"  {'mode':<16} {'save blocks':>12} {'commit: median':>15} {'best':>7} "
        f"{'parent CPU':>11} {'updates':>8} {'events':>7}"
    )
    for mode in MODES:
        print(
            f"  {mode:<16} {med(mode, 'blocked') * 1e3:>9.1f} ms {med(mode, 'commit'):>13.3f} s "
            f"{best(mode):>5.3f} s {med(mode, 'parent_cpu') * 1e3:>8.1f} ms "
            f"{med(mode, 'updates'):>8.0f} {med(mode, 'events'):>7.0f}"
        )
    for label, a, b in [
        ("live widget vs none (journal on)", "journal+widget", "journal"),
        ("journal vs no journal", "journal", "no journal"),
        ("journal + live widget vs neither", "journal+widget", "no journal"),
    ]:
        print(
            f"  {label:<34} median {(med(a, 'commit') / med(b, 'commit') - 1) * 100:+6.1f} %"
            f"   best {(best(a) / best(b) - 1) * 100:+6.1f} %"
        )
    us = _emit_cost_us()
    events = med("journal", "events") / args.processes
    watcher = med("journal+widget", "parent_cpu") - med("journal", "parent_cpu")
    commit = med("journal", "commit")
    print(
        f"  accounted: {events:.0f} events per process x {us:.1f} us = "
        f"{events * us / 1e3:.2f} ms per process per save ({events * us / 1e4 / commit:.3f} %); "
        f"watcher {watcher * 1e3:.1f} ms CPU per save ({watcher / commit * 100:.2f} % of one core)"
    )
    print(
        "  per-rep commit s: "
        + "; ".join(f"{m}: " + " ".join(f"{r['commit']:.2f}" for r in results[m]) for m in MODES)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
