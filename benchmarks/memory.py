"""Peak memory of repeated saves: does it grow?

Run: ``.venv/bin/python benchmarks/memory.py [--size 256M] [--saves 100] [--processes 4]``

Each process saves the same sharded state ``--saves`` times in a row (retention keeps
two steps). Before every save it resets its resident-memory high-water mark
(``/proc/self/clear_refs`` 5) and after the commit reads ``VmHWM``: the peak resident
memory during that save. Growth compares the median of the last ten saves with that
of saves 2 to 11 (the first save also pays one-time imports and thread pools, so it is
reported apart). The last line sums it up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_report import fmt_size, parse_size  # noqa: E402
from compare import ENV  # noqa: E402
from engine_bench import scratch_dir  # noqa: E402

from nbckpt.procgroup import ProcessGroup  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the repeated saves and print the growth of the peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256M")
    parser.add_argument("--saves", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args(argv)
    base = scratch_dir("nbckpt-memory-", args.dir)
    try:
        with ProcessGroup(args.processes, env=ENV) as group:
            built = group.run("_workers:build", parse_size(args.size))
            rss0 = group.run("_workers:rss")
            peaks = group.run("_workers:nb_repeated_saves", str(base / "root"), args.saves)
            rss1 = group.run("_workers:rss")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    owned = max(b["owned"] for b in built)
    window = max(1, min(10, args.saves // 4))
    print(
        f"nbckpt memory: {args.saves} consecutive saves of {fmt_size(built[0]['total'])}, "
        f"{args.processes} processes, {fmt_size(owned)} owned per process"
    )
    growths = []
    for p, series in enumerate(peaks):
        # The first save also pays one-time imports, thread pools and allocator arenas.
        abs_peaks = [s["peak"] for s in series]
        first = statistics.median(abs_peaks[1 : 1 + window] or abs_peaks)
        mid = statistics.median(abs_peaks[len(abs_peaks) // 2 - window // 2 :][:window])
        last = statistics.median(abs_peaks[-window:])
        above = max(s["above"] for s in series[1:] or series)
        growth = (last - first) / first * 100
        growths.append(growth)
        print(
            f"  process {p}: peak RSS during a save: first {fmt_size(abs_peaks[0])}, "
            f"saves 2-{1 + window} {fmt_size(int(first))}, middle {fmt_size(int(mid))}, "
            f"last {window} {fmt_size(int(last))}: growth {growth:+.1f} %; largest peak "
            f"above the RSS before a save (after the first) {fmt_size(above)} "
            f"({above / owned:.2f} x owned); RSS {fmt_size(rss0[p])} -> {fmt_size(rss1[p])}"
        )
    worst = max(growths)
    print(
        f"SUMMARY: peak RSS during a save grew at most {worst:+.1f} % over {args.saves} saves "
        f"(target <= 5 %), load {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
