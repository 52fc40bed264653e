"""How long ``%ckpt_cluster start`` takes, next to plain ipyparallel starting the same engines.

Run: ``.venv/bin/python benchmarks/cluster_start.py [--n 4] [--reps 5]``

Per repetition, in alternating order, from this process (the notebook's kernel):

- ``plain``: ipyparallel alone, as nbckpt configures it: ``ipp.Cluster(n=N,
  controller_ip="127.0.0.1", controller_args=["--HeartMonitor.period=500"],
  log_level=40, engines="local")``, then ``start_cluster_sync``,
  ``connect_client_sync`` and ``wait_for_engines(N)``, until every engine answered one
  trivial apply;
- ``nbckpt``: ``JaxCluster(n=N).start()`` until the JAX job is ready
  (``timings["ready_s"]``): the same engines, joined by ``jax.distributed``, with
  nbckpt's engine imported.

Each is stopped before the next starts (stopping is not timed). Medians are over
repetitions; the target is nbckpt's median within 1.25x of plain's. The machine's load
average is printed before and after: on a shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO)]

import ipyparallel as ipp  # noqa: E402  (imported once, before any start is timed)

from nbckpt.session.cluster import JaxCluster  # noqa: E402

SYSTEMS = ("plain", "nbckpt")
TARGET = 1.25


def plain(n: int) -> dict[str, float]:
    """Start a plain ipyparallel cluster of ``n`` local engines; seconds until all answer."""
    t0 = time.perf_counter()
    cluster = ipp.Cluster(
        n=n,
        controller_ip="127.0.0.1",
        controller_args=["--HeartMonitor.period=500"],
        log_level=40,
        engines="local",
    )
    client = None
    try:
        cluster.start_cluster_sync()
        client = cluster.connect_client_sync()
        client.wait_for_engines(n, timeout=120)
        engines = time.perf_counter() - t0
        client[:].apply_sync(os.getpid)
        return {"ready": time.perf_counter() - t0, "engines": engines}
    finally:
        if client is not None:
            client.close()
        cluster.stop_cluster_sync()


def nbckpt(n: int) -> dict[str, float]:
    """Start ``JaxCluster(n=n)``; its own timings (seconds)."""
    cluster = JaxCluster(n=n)
    try:
        cluster.start()
        t = cluster.timings
        return {
            "ready": t["ready_s"],
            "engines": t["engines_s"],
            "join": t["jax_init_s"],
        }
    finally:
        cluster.stop()


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Alternate both starts ``--reps`` times; print each, the medians and the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4, help="engines (JAX processes)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)

    runs = {"plain": plain, "nbckpt": nbckpt}
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    orders: list[str] = []
    before = load()
    for rep in range(args.reps):
        order = SYSTEMS[rep % 2 :] + SYSTEMS[: rep % 2]
        orders.append(" then ".join(order))
        for system in order:
            results[system].append(runs[system](args.n))
        print(
            f"rep {rep + 1}/{args.reps}: plain {results['plain'][-1]['ready']:.2f} s, "
            f"nbckpt {results['nbckpt'][-1]['ready']:.2f} s (load {load()})",
            file=sys.stderr,
            flush=True,
        )
    after = load()

    def med(system: str, key: str) -> float:
        return statistics.median(r[key] for r in results[system])

    ratio = med("nbckpt", "ready") / med("plain", "ready")
    lines = [
        f"## Cluster start: {args.n} local engines, {args.reps} reps",
        "",
        f"- CPU: {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"load average (1/5/15 min) {before} before, {after} after",
        "- plain: ipyparallel's start_cluster_sync + connect_client_sync + "
        "wait_for_engines, then one trivial apply on every engine",
        "- nbckpt: JaxCluster.start() until the JAX job is ready (timings['ready_s'])",
        "",
        "| rep | order | plain: registered | plain: ready | nbckpt: registered "
        "| nbckpt: joined | nbckpt: ready |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rep, (p, b) in enumerate(zip(results["plain"], results["nbckpt"], strict=True)):
        lines.append(
            f"| {rep + 1} | {orders[rep]} | {p['engines']:.2f} s | {p['ready']:.2f} s | "
            f"{b['engines']:.2f} s | {b['join']:.2f} s | {b['ready']:.2f} s |"
        )
    lines += [
        f"| median | | {med('plain', 'engines'):.2f} s | {med('plain', 'ready'):.2f} s | "
        f"{med('nbckpt', 'engines'):.2f} s | {med('nbckpt', 'join'):.2f} s | "
        f"{med('nbckpt', 'ready'):.2f} s |",
        "",
        f"ratio nbckpt/plain (medians of ready): {ratio:.2f}",
        f"ready within {TARGET}x of plain ipyparallel: "
        + ("met" if ratio <= TARGET else "NOT met"),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
