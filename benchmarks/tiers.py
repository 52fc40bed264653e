"""Recovery from the fastest tier, side by side: local copies and peers vs disk vs S3.

Run: ``.venv/bin/python benchmarks/tiers.py [--size 1G] [--reps 3] [--processes 4]``
(``--quick``: 16 MiB, one repetition, a smoke run). Needs moto (the ``dev`` extra): the
script starts its own S3 server (moto on 127.0.0.1, in memory: a real S3 is slower).

One group of local JAX processes (one CPU device each, each process its own host
with its own local directory under ``/dev/shm``) holds the ``fsdp`` state of
``benchmarks/compare.py`` and, every repetition, in this order and its reverse in turns
(``engine_bench.in_turn``; memory a run frees stays in the guest meanwhile, where the
VM offers it: ``engine_bench.hold_freed_memory``):

- ``disk``: no local tier; save to a root on the local disk (to durable), drop the
  page cache, restore the newest step: the cold read a restarted job does today;
- ``s3``: the same with an ``s3://`` root;
- ``tiered``: ``local_dir`` per process; save step 1 with ``persistent_every=1`` (to
  the local tier and the disk root), then step 2 with a large ``persistent_every``
  (the local tier only); then wipe process 2's local directory (its host was
  replaced) and restore: step 2 comes from the local copies, process 2's shards from
  the peer that kept its replica.

Each figure is the slowest process's, with min/median/max over repetitions (this
machine is shared and noisy: read the spread). Steps lost per failure follow from the
measured background time of a save: a save every ``k`` steps is sustainable when a
save is durable within ``k`` training steps, and a failure at a random step loses
``k / 2`` steps on average (as many as since the last recoverable save).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_report import fmt_size, parse_size  # noqa: E402
from compare import group_of  # noqa: E402
from engine_bench import drop_cache, hold_freed_memory, in_turn, scratch_dir  # noqa: E402

from nbckpt import storage  # noqa: E402
from nbckpt.storage.local_s3 import S3Server  # noqa: E402

W = "_workers"
T = "_tier_workers"
#: Training step times the steps-lost table assumes (seconds).
STEP_TIMES = (0.5, 2.0)

Series = dict[str, list[float]]


def _slowest(results: list[dict[str, float]], key: str) -> float:
    return max(float(r[key]) for r in results)


def one_rep(group: object, env: dict[str, str] | None, work: Path, bucket: str, rep: int) -> Series:
    """One repetition of every system; the slowest process's seconds per figure."""
    from nbckpt.procgroup import ProcessGroup

    assert isinstance(group, ProcessGroup)
    got: Series = {}

    def put(name: str, value: float) -> None:
        got.setdefault(name, []).append(value)

    def disk() -> None:
        root = str(work / f"disk-{rep}")
        saved = group.run(f"{T}:save", root, None, 1)
        put("disk save blocks", _slowest(saved, "blocked"))
        put("disk save durable", _slowest(saved, "durable"))
        drop_cache(work)
        put("recovery: cold disk", _slowest(group.run(f"{T}:restore", root, None), "seconds"))
        shutil.rmtree(root)

    def s3() -> None:
        root = f"s3://{bucket}/rep-{rep}"
        saved = group.run(f"{T}:save", root, None, 1, kwargs={"env": env})
        put("s3 save durable", _slowest(saved, "durable"))
        back = group.run(f"{T}:restore", root, None, kwargs={"env": env})
        put("recovery: s3", _slowest(back, "seconds"))
        storage.remove_tree(storage.location(root))

    def tiered() -> None:
        root = str(work / f"tier-{rep}")
        shm = Path("/dev/shm") / f"nbckpt-bench-{uuid.uuid4().hex[:8]}"
        local = str(shm / "p{process}")
        try:
            both = group.run(f"{T}:save", root, local, 1, kwargs={"persistent_every": 1})
            put("tiered save blocks (local + disk)", _slowest(both, "blocked"))
            put("tiered save durable (local + disk)", _slowest(both, "durable"))
            alone = group.run(f"{T}:save", root, local, 2, kwargs={"persistent_every": 10**6})
            put("tiered save blocks (local only)", _slowest(alone, "blocked"))
            put("tiered save durable (local only)", _slowest(alone, "durable"))
            shutil.rmtree(shm / "p2")  # process 2's host was replaced: its memory is empty
            drop_cache(work)
            back = group.run(f"{T}:restore", root, local)
            if {r["tier"] for r in back} != {"local"}:
                raise AssertionError(f"the tiered restore did not read the local tier: {back}")
            put("recovery: local + peers", _slowest(back, "seconds"))
            put("bytes from peers (process 2)", float(back[2]["fetched"]))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)

    systems: list[Callable[[], None]] = [disk, tiered] if env is None else [disk, s3, tiered]
    for run in in_turn(systems, rep):
        run()
    return got


def _spread(xs: list[float]) -> str:
    return f"{min(xs):8.3f} {statistics.median(xs):8.3f} {max(xs):8.3f}"


def _ratio(series: Series, a: str, b: str) -> tuple[float, str]:
    """``median(a) / median(b)``, with the range of per-repetition ratios."""
    per = [x / y for x, y in zip(series[a], series[b], strict=True) if y > 0]
    med = statistics.median(series[a]) / statistics.median(series[b])
    return med, f"{med:.2f}x (per repetition {min(per):.2f}x to {max(per):.2f}x)"


def report(series: Series, nbytes: int, processes: int, reps: int) -> list[str]:
    """The table, the ratios and the steps-lost estimate, as markdown lines."""
    lines = [
        f"{fmt_size(nbytes)} state (`fsdp`), {processes} processes, {reps} repetitions; "
        "seconds of the slowest process",
        "",
        "| figure | min | median | max |",
        "| --- | --- | --- | --- |",
    ]
    for name, xs in series.items():
        if name.startswith("bytes"):
            lines.append(f"| {name} | {fmt_size(int(statistics.median(xs)))} | | |")
            continue
        lo, mid, hi = _spread(xs).split()
        lines.append(f"| {name} | {lo} | {mid} | {hi} |")
    rec = "recovery: local + peers"
    has_s3 = "recovery: s3" in series
    vs_s3, s3_text = _ratio(series, "recovery: s3", rec) if has_s3 else (math.nan, "n/a")
    vs_disk, disk_text = _ratio(series, "recovery: cold disk", rec)
    added, added_text = _ratio(series, "tiered save blocks (local only)", "disk save blocks")
    both, both_text = _ratio(series, "tiered save blocks (local + disk)", "disk save blocks")
    lines += [
        "",
        f"- Recovery after a host is replaced: local + peers is {s3_text} faster than "
        f"from S3 and {disk_text} faster than a cold read of the disk root.",
        f"- Blocking time of a save with the local tier, over one without: {added_text} "
        f"(local only), {both_text} (local + disk).",
    ]
    local = statistics.median(series["tiered save durable (local only)"])
    disk_s = statistics.median(series["disk save durable"])
    s3_s = statistics.median(series["s3 save durable"]) if has_s3 else math.nan
    for step_s in STEP_TIMES:
        k = {
            name: max(1, math.ceil(t / step_s)) if t == t else math.nan  # NaN: not run
            for name, t in (("disk", disk_s), ("s3", s3_s), ("local", local))
        }
        lines.append(
            f"- With {step_s:g} s training steps, a save every {k['local']} step(s) is "
            f"sustainable to the local tier, every {k['disk']} to the disk root and every "
            f"{k['s3']} to S3: a failure loses {k['local'] / 2:g}, {k['disk'] / 2:g} and "
            f"{k['s3'] / 2:g} steps on average (while no more hosts than "
            "`local_replicas` are lost at once; more, and the tiered job falls back to "
            "its last persistent step)."
        )
    lines.append("")
    lines.append(
        f"RESULT recovery_vs_s3={vs_s3:.2f} recovery_vs_disk={vs_disk:.2f} "
        f"blocking_added={added:.2f} blocking_both={both:.2f}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where the disk roots go (a temp folder)")
    parser.add_argument("--quick", action="store_true", help="16 MiB, 1 rep: a smoke run")
    parser.add_argument("--no-s3", action="store_true", help="without the S3 server (moto)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.reps = "16M", 1
    if args.processes < 3:
        raise SystemExit("--processes: at least 3 (one host is replaced, its peers serve it)")
    nbytes = parse_size(args.size)
    work = scratch_dir("nbckpt-tiers-", args.dir)
    load = os.getloadavg()
    t0 = time.time()
    series: Series = {}
    bucket = f"nbckpt-tiers-{uuid.uuid4().hex[:8]}"
    server = None if args.no_s3 else S3Server()
    env: dict[str, str] | None = None
    try:
        if server is not None:
            server.create_bucket(bucket)
            env = server.env()
            os.environ.update(env)  # the parent names s3:// roots too (to delete them)
        with hold_freed_memory() as held, group_of(args.processes) as group:
            group.run(f"{W}:build", nbytes)
            for rep in range(args.reps):
                print(f"repetition {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
                for name, xs in one_rep(group, env, work, bucket, rep).items():
                    series.setdefault(name, []).extend(xs)
            group.run(f"{W}:build", 0, 1)  # let go of the state
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    cli = argv if argv is not None else sys.argv[1:]
    print(f"# Recovery from the fastest tier (`benchmarks/tiers.py {' '.join(cli)}`)")
    print(
        f"{os.cpu_count()} cores, load average {load[0]:.2f} at start and "
        f"{os.getloadavg()[0]:.2f} at end; {(time.time() - t0) / 60:.1f} minutes; "
        + ("no S3 (--no-s3)" if args.no_s3 else "S3 is moto (Python, in memory) on 127.0.0.1")
        + "; local directories are in /dev/shm"
    )
    print(held)
    print()
    print("\n".join(report(series, nbytes, args.processes, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
