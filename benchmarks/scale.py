"""nbckpt's control plane at 4 to 1,024 processes, simulated on this machine.

Run: ``.venv/bin/python benchmarks/scale.py [--processes 4,16,64,256,1024] [--reps 5]
[--per-worker 64] [--dir DIR] [--out FILE.md] [--plot FILE.png]``. ``--out`` writes the
section that ``benchmarks/RESULTS.md`` carries; ``--plot`` draws barrier, view and route
times against N.

What is real: one coordination service (jaxlib's, hosted by worker 0 as process 0 of a
job hosts it), one client of it per simulated process, and nbckpt's own code on each:
heartbeats and the dial that tells died from unreachable, barriers, the preflight
agreement, a save's background job (barriers, the primary's commit by rename, the
decision), the journal, and, on the notebook side, the journal's reader, the
operation view, the widget's model and the sidebar's operation route. What is
simulated: the processes share a few OS processes (``--per-worker`` each) and two
cores, so a figure at 1,024 includes their contention; they have no devices and save
a tree of two tiny NumPy leaves (the primary writes them), so no array bytes move;
a process "dies" by stopping its heartbeats and closing its port (its service client
stays connected).

Columns: ``barrier`` is nbckpt's barrier and ``service`` the service's own
``wait_at_barrier`` at the same N, each from the last arrival to the last release,
with every process's thread already waiting (median, min-max over ``--reps``);
``agree`` the preflight of a save (last start to last agreement); ``save`` one whole
save, first start to last commit; ``detect`` from a process's death to the last
survivor's error naming it; ``files`` and ``bytes`` the journal of one save;
``read`` to read and merge it, ``view`` to build the operation view from that record,
``widget`` the widget's model (above 16 processes the job as a whole, and the rows and
timeline lanes of the processes that matter), ``route`` the sidebar's operation route
(read, merge and answer) and ``model KiB`` / ``route KiB`` what each sends;
``peak MiB`` the notebook side's peak Python allocation while reading and viewing. The
notebook side is measured after the simulated job ended (its journal stays on disk).
The last line printed is ``RESULT processes=N barrier_ms=X service_barrier_ms=S
detect_s=Y view_ms=Z route_ms=W`` for the largest N.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from engine_bench import scratch_dir  # noqa: E402  (the one copy)

from nbckpt.journal import read_operation  # noqa: E402
from nbckpt.server.manager import CheckpointManager  # noqa: E402
from nbckpt.sim import Simulation  # noqa: E402
from nbckpt.views.monitor import view_state  # noqa: E402
from nbckpt.widgets.progress import timeline_of, widget_model  # noqa: E402


def spread(values: list[float], digits: int = 1) -> str:
    """``median (min-max)``."""
    if not values:
        return "n/a"
    med, lo, hi = (f"{v:.{digits}f}" for v in (statistics.median(values), min(values), max(values)))
    return f"{med} ({lo}-{hi})"


def timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    """Run ``fn`` ``reps`` times; milliseconds of each, and the last result."""
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times, out


def journal_size(folder: Path) -> tuple[int, int]:
    """Files and bytes of one operation's journal."""
    files = [p for p in folder.iterdir() if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def notebook_side(base: Path, root: Path, op: str, reps: int) -> dict[str, Any]:
    """Read, view, model and route one operation's journal; times, sizes, peak memory."""
    read_ms, record = timed(lambda: read_operation(root, op), reps)
    view_ms, view = timed(lambda: view_state(record), reps)

    def model() -> dict[str, Any]:
        # What the widget sends: above 16 processes the summary and a few rows and lanes.
        traits = widget_model(view)
        return {**traits, "timeline": timeline_of(record, traits.pop("only"))}

    widget_ms, sent = timed(model, reps)
    manager = CheckpointManager(base)
    route_ms, answer = timed(lambda: manager.operation(root.name, op), reps)
    tracemalloc.start()
    view_state(read_operation(root, op))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    files, nbytes = journal_size(root / ".nbckpt" / "ops" / op)
    return {
        "read": read_ms,
        "view": view_ms,
        "widget": widget_ms,
        "route": route_ms,
        "model_kib": len(json.dumps(sent, default=str)) / 1024,
        "route_kib": len(json.dumps(answer, default=str)) / 1024,
        "peak_mib": peak / 2**20,
        "files": files,
        "bytes": nbytes,
    }


def measure(n: int, base: Path, reps: int, per_worker: int) -> dict[str, Any]:
    """Every figure of one row, at ``n`` simulated processes."""
    root = base / f"n{n}"
    row: dict[str, Any] = {"n": n}
    t = time.perf_counter()
    with Simulation(n, root, per_worker=per_worker) as sim:
        row["start_s"] = time.perf_counter() - t
        sim.barrier("warmup")
        ours, theirs = [], []
        for r in range(reps):
            ours.append(sim.barrier(f"nb{r}").release_ms)
            theirs.append(sim.barrier(f"svc{r}", kind="service").release_ms)
        row["barrier"], row["service"] = ours, theirs
        saved = sim.save(1)
        if saved.errors:
            raise RuntimeError(f"the save at {n} failed: {next(iter(saved.errors.values()))}")
        row["agree"], row["save"] = [saved.agree_ms], [saved.total_ms]
        lost = sim.save(2, victim=n // 2)
        row["detect"], row["named"] = lost.detect_s, lost.named
        row["worker_mib"] = max(sim.worker_rss()) / 2**20
    # The notebook side reads the journal once the simulated job has ended, as a
    # notebook on its own machine would: not on two cores shared with N heartbeats.
    assert saved.op is not None
    row.update(notebook_side(base, root, saved.op, reps))
    return row


HEAD = (
    "| processes | barrier ms | service ms | barrier/service | agree ms | save ms | detect s "
    "| journal files | journal KiB | read ms | view ms | widget ms | route ms | model KiB "
    "| route KiB | peak MiB |"
)


def table_row(r: dict[str, Any]) -> str:
    ratio = [a / b for a, b in zip(r["barrier"], r["service"], strict=True)]
    cells = [
        str(r["n"]),
        spread(r["barrier"]),
        spread(r["service"]),
        spread(ratio, 2),
        f"{r['agree'][0]:.0f}",
        f"{r['save'][0]:.0f}",
        f"{r['detect']:.2f}" + ("" if r["named"] else " (not named)"),
        str(r["files"]),
        f"{r['bytes'] / 1024:.0f}",
        spread(r["read"]),
        spread(r["view"]),
        spread(r["widget"]),
        spread(r["route"]),
        f"{r['model_kib']:.0f}",
        f"{r['route_kib']:.0f}",
        f"{r['peak_mib']:.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


def result_line(r: dict[str, Any]) -> str:
    return (
        f"RESULT processes={r['n']} barrier_ms={statistics.median(r['barrier']):.2f} "
        f"service_barrier_ms={statistics.median(r['service']):.2f} "
        f"detect_s={r['detect']:.2f} view_ms={statistics.median(r['view']):.1f} "
        f"route_ms={statistics.median(r['route']):.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="4,16,64,256,1024")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--per-worker", type=int, default=64)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--plot", default=None, help="draw the times against N (a .png)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.processes.split(",")]
    base = scratch_dir("nbckpt-scale-", args.dir)
    load = os.getloadavg()[0]
    lines = [f"load average {load:.2f} at start; {os.cpu_count()} CPUs", HEAD, "|---" * 16 + "|"]
    print("\n".join(lines), flush=True)
    rows = []
    try:
        for n in sizes:
            rows.append(measure(n, base, args.reps, args.per_worker))
            lines.append(table_row(rows[-1]))
            print(lines[-1], flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines.append(f"load average {os.getloadavg()[0]:.2f} at end")
    lines.append(result_line(rows[-1]))
    print("\n".join(lines[-2:]), flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if args.plot:
        plot(rows, Path(args.plot))
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Barrier (nbckpt's and the service's), view and route medians against N, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for key, label in [
        ("barrier", "nbckpt barrier"),
        ("service", "service wait_at_barrier"),
        ("view", "operation view"),
        ("route", "sidebar route"),
    ]:
        ax.plot(ns, [statistics.median(r[key]) for r in rows], marker="o", label=label)
    ax.plot(ns, [r["detect"] * 1e3 for r in rows], marker="s", ls="--", label="death to error")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("simulated processes")
    ax.set_ylabel("milliseconds (median)")
    ax.set_title("nbckpt's control plane, simulated on 2 cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
