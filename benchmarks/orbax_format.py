"""nbckpt writing Orbax's format, side by side with Orbax and with nbckpt's own format.

Run: ``.venv/bin/python benchmarks/orbax_format.py [--sizes 256M,1G] [--reps 3]``
(``--quick``: 16 MiB, one repetition, a smoke run). Needs Orbax (the ``bench`` extra).

One group of local JAX processes (one CPU device each) holds one float32 state of 8
arrays sharded over every device (random values, so compression gains little, as with
trained weights) and, in one run, every repetition, in this order and its reverse in
turns (``engine_bench.in_turn``):

- ``nbckpt/orbax``: ``AsyncCheckpointer.save(..., format="orbax")``: zarr v3 arrays
  (zstd level 1) in per-process OCDBT databases merged by the primary, then a cold
  restore by nbckpt (which checks every chunk's CRC-32C);
- ``Orbax``: ``ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())`` with its
  durable defaults (OCDBT, zarr v2, zstd level 1), restored by Orbax;
- ``nbckpt``: nbckpt's own format (an uncompressed zarr v2 array per leaf), restored
  by nbckpt;
- and Orbax's restore of the ``nbckpt/orbax`` step, the same files read by Orbax.

Saves are timed to the durable commit; the page cache is dropped before every restore
(``/proc/sys/vm/drop_caches``, or ``posix_fadvise`` per file where that is not
allowed), and memory a run frees stays in the guest while the comparison runs
(``engine_bench.hold_freed_memory``, where the VM offers it). Each figure is the median
over repetitions of the slowest process. The last line printed sums up the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_report import fmt_size, gbps, med, parse_size, ratio  # noqa: E402
from compare import group_of, remove  # noqa: E402
from engine_bench import drop_cache, hold_freed_memory, in_turn, scratch_dir  # noqa: E402

from nbckpt.procgroup import ProcessGroup  # noqa: E402

W = "_workers"
SYSTEMS = ("nbckpt/orbax", "Orbax", "nbckpt")


@dataclass
class Figures:
    """Every repetition's seconds for one size, by system and measure."""

    nbytes: int
    save: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    restore: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    orbax_reads_nb_orbax: list[float] = field(default_factory=list)
    disk: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    cache: set[str] = field(default_factory=set)


def disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_size(
    group: ProcessGroup, base: Path, nbytes: int, reps: int, log: Callable[[str], None]
) -> Figures:
    """Alternate the three systems on one state, ``reps`` times."""
    built = group.run(f"{W}:build", nbytes)
    fig = Figures(nbytes=built[0]["total"])
    tag = f"s{fig.nbytes}"

    def slowest(results: list[dict[str, float]]) -> float:
        return max(float(r["commit"]) for r in results)

    def cold(path: Path) -> None:
        fig.cache.add(drop_cache(path))

    def run_nb_orbax(rep: int) -> None:
        root = base / f"nbo-{tag}-{rep}"
        fig.save["nbckpt/orbax"].append(
            slowest(group.run(f"{W}:nb_save", str(root), rep, kwargs={"format": "orbax"}))
        )
        fig.disk["nbckpt/orbax"].append(disk_bytes(root / str(rep)))
        cold(root)
        fig.restore["nbckpt/orbax"].append(max(group.run(f"{W}:nb_restore", str(root), rep)))
        cold(root)
        step = str(root / str(rep))
        fig.orbax_reads_nb_orbax.append(max(group.run(f"{W}:orbax_restore", step)))
        remove(root)

    def run_orbax(rep: int) -> None:
        path = base / f"orbax-{tag}-{rep}"
        fig.save["Orbax"].append(slowest(group.run(f"{W}:orbax_save", str(path))))
        fig.disk["Orbax"].append(disk_bytes(path))
        cold(path)
        fig.restore["Orbax"].append(max(group.run(f"{W}:orbax_restore", str(path))))
        remove(path)

    def run_nb(rep: int) -> None:
        root = base / f"nb-{tag}-{rep}"
        fig.save["nbckpt"].append(slowest(group.run(f"{W}:nb_save", str(root), rep)))
        fig.disk["nbckpt"].append(disk_bytes(root / str(rep)))
        cold(root)
        fig.restore["nbckpt"].append(max(group.run(f"{W}:nb_restore", str(root), rep)))
        remove(root)

    runners = [run_nb_orbax, run_orbax, run_nb]
    for rep in range(reps):
        # Forward, then backward: no system always runs first, nor after the same one.
        for run in in_turn(runners, rep):
            run(rep)
        log(f"  {fmt_size(fig.nbytes)} rep {rep + 1}/{reps} done")
    return fig


def report(figures: list[Figures], processes: int, reps: int) -> list[str]:
    """The Markdown tables."""
    lines = [
        f"### Durable save and cold restore ({processes} processes, medians of {reps})",
        "",
        "| size | measure | nbckpt/orbax | Orbax | nbckpt | nbckpt/orbax vs Orbax | "
        "nbckpt/orbax vs nbckpt |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in figures:
        n, z = f.nbytes, fmt_size(f.nbytes)
        for measure, table in (("durable save", f.save), ("cold restore", f.restore)):
            t = {s: med(table[s]) for s in SYSTEMS}
            cells = " | ".join(f"{t[s]:.2f} s = {gbps(n, t[s]):.2f} GB/s" for s in SYSTEMS)
            lines.append(
                f"| {z} | {measure} | {cells} | "
                f"{ratio(gbps(n, t['nbckpt/orbax']), gbps(n, t['Orbax']))} | "
                f"{ratio(gbps(n, t['nbckpt/orbax']), gbps(n, t['nbckpt']))} |"
            )
        ob = med(f.orbax_reads_nb_orbax)
        lines.append(
            f"| {z} | Orbax's cold restore of the nbckpt/orbax step | "
            f"{ob:.2f} s = {gbps(n, ob):.2f} GB/s | | | "
            f"{ratio(gbps(n, ob), gbps(n, med(f.restore['Orbax'])))} | |"
        )
        disk = {s: med([float(b) for b in f.disk[s]]) for s in SYSTEMS}
        lines.append(
            f"| {z} | bytes on disk / state | "
            + " | ".join(f"{disk[s] / n:.3f}" for s in SYSTEMS)
            + " | | |"
        )
    lines += [
        "",
        "Ratios are throughput over throughput (higher: nbckpt/orbax is faster). "
        f"Page cache dropped by: {', '.join(sorted(set().union(*(f.cache for f in figures))))}.",
        "",
    ]
    return lines


def summary(f: Figures) -> str:
    """The last line: nbckpt/orbax against Orbax and against nbckpt's own format."""
    n = f.nbytes
    s = {k: gbps(n, med(v)) for k, v in f.save.items()}
    r = {k: gbps(n, med(v)) for k, v in f.restore.items()}
    return (
        f"SUMMARY ({fmt_size(n)}): save nbckpt/orbax vs Orbax "
        f"{ratio(s['nbckpt/orbax'], s['Orbax'])}, vs nbckpt "
        f"{ratio(s['nbckpt/orbax'], s['nbckpt'])}; cold restore nbckpt/orbax vs Orbax "
        f"{ratio(r['nbckpt/orbax'], r['Orbax'])}, vs nbckpt {ratio(r['nbckpt/orbax'], r['nbckpt'])}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256M,1G")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 1 rep: a smoke run")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps = "16M", 1
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    base = scratch_dir("nbckpt-orbax-format-", args.dir)
    t0 = time.time()
    figures = []
    try:
        with hold_freed_memory() as held, group_of(args.processes) as group:
            for nbytes in sizes:
                log(f"size {fmt_size(nbytes)}")
                figures.append(bench_size(group, base, nbytes, args.reps, log))
            group.run(f"{W}:build", 0, 1)  # let go of the state
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cli = argv if argv is not None else sys.argv[1:]
    command = " ".join(["benchmarks/orbax_format.py", *cli])
    print(f"# nbckpt format=orbax vs Orbax vs nbckpt (`{command}`)")
    print(f"{os.cpu_count()} cores; {(time.time() - t0) / 60:.1f} minutes")
    print(held)
    print()
    print("\n".join(report(figures, args.processes, args.reps)))
    print(summary(figures[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
