"""nbckpt side by side with Orbax and with the disk's limit, in one run.

Run: ``.venv/bin/python benchmarks/compare.py [--sizes 64M,256M,1G,4G] [--reps 5]
[--states fsdp,replicated,mesh2d,small] [--state-sizes 64M,256M,1G]``
(``pip install -e ".[bench]"`` installs Orbax; without it the Orbax columns read n/a).
``--quick`` is a smoke run of a minute or two with tiny sizes, one repetition and no
warm-up (``--warmup``, by default one untimed repetition of each state first).

The same group of local JAX processes (one CPU device each) holds a state with random
values and saves and restores it with nbckpt, with Orbax
(``AsyncCheckpointer(StandardCheckpointHandler())``, its durable defaults) and with
plain files (each unique byte written once per job, split evenly among the processes,
``fdatasync``'d, and read back: the raw limit; written both buffered and with
``O_DIRECT``, the one faster over the run counting), forward and backward in turns
(``engine_bench.in_turn``). The states (``_workers.LAYOUTS``) are ``fsdp`` (8 float32
arrays sharded over every device), ``replicated`` (the same arrays whole on every
device), ``mesh2d`` (a 2-D mesh, partly replicated), ``small`` (an optimizer-like tree
of a few large leaves, hundreds of small ones and scalars), ``transformer`` (a
transformer's parameters and AdamW state, 442 leaves) and ``many`` (the same, 4,006
leaves). ``--sizes`` are the sizes of the ``fsdp`` state, which is also written with
plain tensorstore (one uncompressed zarr chunk per shard, fsync'd); ``--state-sizes``
those of every state in ``--states``. A state and size in both grids is measured once.
Every timed call starts at a barrier, as the limit's do. The page cache is dropped
before every read. Where the VM's balloon hands freed memory back to the host, it is
held in the guest for the run (``--page-reporting hold``, the default; see
``engine_bench.hold_freed_memory``). Each figure is the median over repetitions of the
slowest process. The results go to ``benchmarks/RESULTS.md`` (not in ``--quick`` mode
unless ``--out`` is given) and the last line printed sums up the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_goals import goals, goals_table  # noqa: E402
from _compare_method import method  # noqa: E402
from _compare_report import (  # noqa: E402
    KEEP_MARK,
    JournalResult,
    SizeResult,
    fmt_size,
    med,
    parse_size,
    report,
    summary,
)
from _files_table import files_table  # noqa: E402
from _workers import LAYOUTS  # noqa: E402
from engine_bench import (  # noqa: E402  (the one copy of each)
    drop_cache,
    hold_freed_memory,
    in_turn,
    scratch_dir,
)

from nbckpt.procgroup import ProcessGroup  # noqa: E402

W = "_workers"
#: Rounds of barriers, each kind once a round: the ratio is judged on their median.
BARRIER_ROUNDS = 15
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}


def dd_write(path: Path, nbytes: int) -> float:
    """Write ``nbytes`` in one stream and ``fdatasync``: the disk's durable bandwidth."""
    block = b"\x5a" * (16 * 2**20)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def remove(path: Path) -> None:
    """Delete a run's files and flush the deletion, so the next run starts on a quiet disk."""
    shutil.rmtree(path)
    os.sync()


def slowest(results: list[dict[str, float]], key: str) -> float:
    """The slowest (largest) figure over processes."""
    return max(float(r[key]) for r in results)


class Tailer:
    """Re-read the journal of the newest operation under a root every ``period_s``.

    What the live widget does in the notebook kernel: it shares the disk, not the CPU
    of the engines, but on this machine it shares both.
    """

    def __init__(self, root: Path, period_s: float = 0.25) -> None:
        self.root, self.period_s = root, period_s
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from nbckpt.journal import list_operations, read_operation

        while not self._stop.is_set():
            try:
                ops = list_operations(self.root)
                if ops:
                    read_operation(self.root, ops[-1])
                    self.reads += 1
            except (FileNotFoundError, OSError):
                pass
            self._stop.wait(self.period_s)

    def __enter__(self) -> Tailer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def group_of(n: int) -> Iterator[ProcessGroup]:
    """A group of ``n`` local JAX processes with the benchmark modules importable."""
    with ProcessGroup(n, env=ENV) as group:
        yield group


def bench_size(
    group: ProcessGroup,
    base: Path,
    nbytes: int,
    reps: int,
    orbax: bool,
    log: Callable[[str], None],
    layout: str = "fsdp",
    warmup: int = 1,
) -> SizeResult:
    """Alternate nbckpt, Orbax and the raw limits on one state, ``reps`` times.

    The plain-file limit is measured for every layout; raw tensorstore and the
    single-stream write (the "Save and cold restore" table's columns) for ``fsdp``.
    ``warmup`` repetitions of them all run first and are not counted: on this VM the
    first use of memory the host took back is slow, and it fell on whoever ran first
    (nbckpt's first restore of the 1 GiB ``fsdp`` state: 1.5-1.6 s against about
    0.6 s; see RESULTS.md).
    """
    built = group.run(f"{W}:build", nbytes, kwargs={"layout": layout})
    res = SizeResult(
        nbytes=built[0]["total"],
        owned=max(b["owned"] for b in built),
        layout=layout,
        unique_owned=max(b["unique_owned"] for b in built),
        leaves=built[0].get("leaves", 0),
    )
    tag = f"{layout}-s{res.nbytes}"

    # One checkpointer per process for all repetitions, as in a training loop; each
    # repetition's step is deleted once restored.
    steady = {"steady": True}

    def run_nb(rep: int) -> None:
        root = base / f"nb-{tag}"
        out = group.run(f"{W}:nb_save", str(root), rep, kwargs=steady)
        res.nb_blocked.append(slowest(out, "blocked"))
        res.nb_commit.append(slowest(out, "commit"))
        res.nb_peak.append(slowest(out, "peak"))
        drop_cache(root)
        res.nb_restore.append(max(group.run(f"{W}:nb_restore", str(root), rep)))
        # The same files read plainly: the restore's own cost against its files' cost.
        drop_cache(root)
        plain = group.run("_step_files:read_step_files", str(root), rep, f"{tag}-{rep}")
        res.files_read.append(max(p["seconds"] for p in plain))
        res.files_per_process = max(int(p["files"]) for p in plain)
        remove(root / str(rep))

    def run_ob(rep: int) -> None:
        path = base / f"orbax-{tag}-{rep}"
        out = group.run(f"{W}:orbax_save", str(path), kwargs=steady)
        res.ob_blocked.append(slowest(out, "blocked"))
        res.ob_commit.append(slowest(out, "commit"))
        res.ob_peak.append(slowest(out, "peak"))
        drop_cache(path)
        res.ob_restore.append(max(group.run(f"{W}:orbax_restore", str(path))))
        remove(path)

    def run_raw(rep: int) -> None:
        path = base / f"raw-{tag}-{rep}"
        res.raw_write.append(max(group.run(f"{W}:raw_write", str(path), f"{tag}-{rep}")))
        drop_cache(path)
        res.raw_read.append(max(group.run(f"{W}:raw_read", str(path), f"{tag}-{rep}")))
        remove(path)
        res.dd_write.append(dd_write(base / "dd.bin", res.nbytes))

    def run_file(rep: int) -> None:
        path = base / f"file-{tag}-{rep}"
        # The limit is the faster (by median over the run) of a buffered write and an
        # O_DIRECT one (nbckpt writes its large chunks so), made in turns; the buffered
        # file is read back.
        times = {}
        for direct in (True, False) if rep % 2 else (False, True):
            where = path / ("direct" if direct else "buffered")
            times[direct] = max(
                group.run(f"{W}:raw_file_write", str(where), f"{tag}-{rep}-{direct}", direct)
            )
            if direct:
                remove(where)
        res.lim_write_buffered.append(times[False])
        res.lim_write_direct.append(times[True])
        drop_cache(path)
        read = max(group.run(f"{W}:raw_file_read", str(path / "buffered"), f"{tag}-{rep}"))
        res.lim_read.append(read)
        remove(path)

    runners: list[Callable[[int], None]] = [run_nb, run_file]
    if layout == "fsdp":
        runners.append(run_raw)
    if orbax:
        runners.append(run_ob)
    for rep in range(warmup + reps):
        # The warm-up runs in the reverse of the first timed repetition's order.
        for run in in_turn(runners, rep - warmup):
            run(rep)
        # Each repetition's restore times, so that a slow one can be told from the rest.
        which = "warm-up" if rep < warmup else f"rep {rep - warmup + 1}/{reps}"
        log(
            f"  {layout} {fmt_size(res.nbytes)} {which} done (durable save "
            f"{res.nb_commit[-1]:.2f} s, the plain-file writes "
            f"{res.lim_write_buffered[-1]:.2f} s and {res.lim_write_direct[-1]:.2f} s; cold "
            f"restore {res.nb_restore[-1]:.2f} s, its files read plainly "
            f"{res.files_read[-1]:.2f} s, the plain-file limit {res.lim_read[-1]:.2f} s)"
        )
    group.run(f"{W}:close_all")
    remove(base / f"nb-{tag}")
    res.drop_first(warmup)
    return res


def bench_journal(
    group: ProcessGroup, base: Path, nbytes: int, reps: int, log: Callable[[str], None]
) -> JournalResult:
    """The journal's own cost, and that of a widget-like tailer re-reading it."""
    built = group.run(f"{W}:build", nbytes)
    res = JournalResult(nbytes=built[0]["total"])
    for rep in range(reps):
        for variant in ("on", "off", "tailed")[rep % 3 :] + ("on", "off", "tailed")[: rep % 3]:
            root = base / f"journal-{variant}-{rep}"
            if variant == "tailed":
                with Tailer(root) as tailer:
                    out = group.run(f"{W}:nb_save", str(root), rep)
                res.reads += tailer.reads
            else:
                out = group.run(f"{W}:nb_save", str(root), rep, kwargs={"journal": variant == "on"})
            getattr(res, variant).append(slowest(out, "commit"))
            remove(root)
        log(f"  journal rep {rep + 1}/{reps} done")
    return res


def bench_scaling(
    base: Path, nbytes: int, reps: int, counts: Sequence[int], log: Callable[[str], None]
) -> dict[int, tuple[float, float, int]]:
    """nbckpt save and cold-restore seconds with 1, 2, 4 processes at the same bytes."""
    out: dict[int, tuple[float, float, int]] = {}
    for n in counts:
        commits, restores = [], []
        with group_of(n) as group:
            total = group.run(f"{W}:build", nbytes)[0]["total"]
            for rep in range(reps):
                root = base / f"scale-{n}-{rep}"
                res = group.run(f"{W}:nb_save", str(root), rep)
                commits.append(slowest(res, "commit"))
                drop_cache(root)
                restores.append(max(group.run(f"{W}:nb_restore", str(root), rep)))
                remove(root)
        out[n] = (med(commits), med(restores), total)
        log(f"  scaling: {n} process(es) done")
    return out


def bench_barriers(
    group: ProcessGroup, count: int, rounds: int
) -> list[tuple[float, float, float]]:
    """Per round, the median round trip of ``count`` barriers of each kind.

    The kinds: nbckpt's barrier, its key-value form alone, and jax's
    ``wait_at_barrier``. Each round runs the three in another order, so that none is
    always first after the saves or always last: the ratios pair the kinds of one round.
    """
    kinds = [
        (f"{W}:barriers", ()),
        (f"{W}:barriers", (0.0,)),
        (f"{W}:jax_barriers", ()),
    ]
    out = []
    for r in range(rounds):
        times = [0.0, 0.0, 0.0]
        for k in [(r + i) % 3 for i in range(3)]:
            fn, extra = kinds[k]
            times[k] = max(group.run(fn, count, f"{k}-{r}", *extra))
        out.append((times[0], times[1], times[2]))
    return out


# -- the machine ----------------------------------------------------------------------


def _cmd(*args: str) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def machine(base: Path) -> list[str]:
    """A few lines that describe where the figures were measured."""
    mem = next(
        (
            ln.split()[1]
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if "MemTotal" in ln
        ),
        "0",
    )
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    df = _cmd("df", "-h", "--output=source,fstype,size,avail", str(base)).splitlines()
    dev = df[-1].split()[0] if df else "?"
    rota = Path(f"/sys/block/{Path(dev).name}/queue/rotational")
    kind = {"0": "non-rotational", "1": "reported rotational (virtual disk)"}.get(
        rota.read_text().strip() if rota.exists() else "", "unknown"
    )
    rev = _cmd("git", "-C", str(REPO), "rev-parse", "--short", "HEAD")
    # Figures from a tree with changes of its own are not the commit's: say so.
    if rev and _cmd("git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"):
        rev += " with uncommitted changes"
    return [
        f"- CPU: {os.cpu_count()} cores (`nproc`), {cpu}",
        f"- memory: {int(mem) / 2**20:.1f} GiB",
        f"- disk: {df[-1] if df else '?'} ({kind})",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}, jax {_version('jax')}, jaxlib "
        f"{_version('jaxlib')}, tensorstore {_version('tensorstore')}, numpy "
        f"{_version('numpy')}, orbax-checkpoint {_version('orbax-checkpoint')}",
        f"- nbckpt at git {rev or '?'}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, print it, write RESULTS.md and print the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64M,256M,1G,4G", help="sizes of the fsdp state")
    parser.add_argument(
        "--states",
        default=",".join(LAYOUTS),
        help=f"state layouts of the States table, from {', '.join(LAYOUTS)}",
    )
    parser.add_argument(
        "--state-sizes", default="64M,256M,1G", help="sizes of every state in --states"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed repetitions of each state first"
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--scaling-size", default="1G", help="total bytes for 1/2/4 processes")
    parser.add_argument("--barriers", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 rep: a smoke run")
    parser.add_argument("--no-orbax", action="store_true", help="skip Orbax even if installed")
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to leave out: journal, scaling"
    )
    parser.add_argument(
        "--page-reporting",
        choices=("hold", "as-is"),
        default="hold",
        help="hold: keep memory a run frees in the guest during the comparison, where "
        "this VM's balloon offers it (put back after); as-is: leave it",
    )
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--out", help="the Markdown report (default benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.scaling_size, args.barriers = "8M,16M", 1, "16M", 50
        args.warmup = 0
        args.state_sizes = "16M"  # with fsdp at 16M from --sizes: measured once
    out = Path(args.out) if args.out else (None if args.quick else HERE / "RESULTS.md")
    sizes = list(dict.fromkeys(parse_size(s) for s in args.sizes.split(",") if s))
    state_sizes = list(dict.fromkeys(parse_size(s) for s in args.state_sizes.split(",") if s))
    states = list(dict.fromkeys(s.strip() for s in args.states.split(",") if s.strip()))
    if unknown := [s for s in states if s not in LAYOUTS]:
        parser.error(f"unknown state(s) {', '.join(unknown)}; choose from {', '.join(LAYOUTS)}")
    # A count below its least would fail mid-run (no medians) or, for --warmup, drop
    # the last repetitions' times instead of the first's: refused before any work.
    for name, least in (("reps", 1), ("warmup", 0), ("processes", 1), ("barriers", 1)):
        if (value := getattr(args, name)) < least:
            parser.error(f"--{name} must be {least} or more, got {value}")
    if not sizes:
        parser.error("--sizes is empty: the fsdp state needs at least one size")
    # fsdp at --sizes feeds the first table, every state at --state-sizes the States
    # table; a state and size in both is measured once. Smallest first, fsdp first
    # within a size, so that a failing layout shows up early.
    plan = sorted(
        {("fsdp", n) for n in sizes} | {(s, n) for s in states for n in state_sizes},
        key=lambda p: (p[1], LAYOUTS.index(p[0])),
    )
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    orbax = not args.no_orbax and _version("orbax-checkpoint") != "not installed"

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    base = scratch_dir("nbckpt-compare-", args.dir)
    load0 = os.getloadavg()
    t_start = time.time()
    measured: dict[tuple[str, int], SizeResult] = {}
    # Held for the whole run, put back before the report is written.
    with hold_freed_memory(args.page_reporting == "hold") as held:
        try:
            with group_of(args.processes) as group:
                for layout, nbytes in plan:
                    log(f"state {layout}, size {fmt_size(nbytes)}")
                    measured[layout, nbytes] = bench_size(
                        group, base, nbytes, args.reps, orbax, log, layout, args.warmup
                    )
                log("barriers")
                bar = bench_barriers(group, args.barriers, max(BARRIER_ROUNDS, args.reps))
                jsize = min(sizes, key=lambda s: abs(s - parse_size(args.scaling_size)))
                journal = None
                if "journal" not in skip:
                    log("journal overhead")
                    journal = bench_journal(group, base, jsize, max(3, args.reps), log)
                group.run(f"{W}:build", 0, 1)  # let go of the state before other groups start
            scaling: dict[int, tuple[float, float, int]] = {}
            if "scaling" not in skip:
                log("scaling")
                counts = sorted({1, 2, args.processes})
                scaling = bench_scaling(base, parse_size(args.scaling_size), args.reps, counts, log)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    load1 = os.getloadavg()
    minutes = (time.time() - t_start) / 60

    results = [measured["fsdp", n] for n in sizes]
    state_rows = [(measured[s, n], measured.get(("fsdp", n))) for n in state_sizes for s in states]
    target = parse_size(args.scaling_size)
    headline = min(results, key=lambda r: abs(r.nbytes - target))
    tables, targets = report(
        results, journal, bar, scaling, headline, args.processes, args.reps, state_rows
    )
    tables += files_table(measured.values(), args.processes, args.reps)
    done_when = goals(results, state_rows, bar)
    tables += goals_table(done_when)
    targets += done_when
    cli = argv if argv is not None else sys.argv[1:]
    head = [
        "# Benchmark results: nbckpt, Orbax and the disk's limit",
        "",
        f"Generated by `benchmarks/compare.py {' '.join(cli)}` "
        f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, "
        f"{minutes:.1f} minutes.",
        "",
        "## Machine",
        "",
        *machine(base.parent),
        f"- load average (1, 5, 15 min) at start {load0[0]:.2f} {load0[1]:.2f} "
        f"{load0[2]:.2f}, at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} (the 2 "
        "cores are shared with other work)",
        f"- {held}",
        "",
        "## Method",
        "",
        method(args.processes, args.warmup, f"{drop_cache.__module__}.drop_cache"),
        "",
        "## Results",
        "",
    ]
    text = "\n".join(head + tables)
    print(text)
    if out is not None:
        # What follows the marker (other benchmarks, notes) is written by hand: keep it.
        kept = out.read_text(encoding="utf-8").partition(KEEP_MARK) if out.exists() else ()
        tail = f"\n{KEEP_MARK}{kept[2]}" if kept and kept[1] else ""
        out.write_text(text + "\n" + tail, encoding="utf-8")
        log(f"wrote {out}")
    print(summary(headline, targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
