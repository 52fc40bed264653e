"""The figures of ``benchmarks/compare.py`` and the Markdown it writes of them.

The measuring stays in ``compare.py``; here are what a run keeps of each state and
size (:class:`SizeResult`), the ratios with their spread over repetitions, the tables,
the older targets (issue 25's, at the headline size) and the summary line; issue 29's
"done when" is judged in ``_compare_goals.py``. Other benchmarks take their size
parsing and ratio helpers from here too.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def parse_size(text: str) -> int:
    """``"64M"`` -> 64 MiB, ``"1G"`` -> 1 GiB, ``"4096"`` -> 4096 bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def fmt_size(n: int) -> str:
    """Bytes as the largest binary unit that keeps them whole-ish (two decimals at most)."""
    for unit, m in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= m:
            return f"{f'{n / m:.2f}'.rstrip('0').rstrip('.')} {unit}"
    return f"{n} B"


def med(xs: Sequence[float]) -> float:
    """Median, or NaN for no data."""
    return statistics.median(xs) if xs else float("nan")


@dataclass
class SizeResult:
    """Every repetition's figures for one state layout and size.

    ``nbytes`` is the state's unique bytes, ``owned`` the most bytes a process holds
    (replicas included) and ``unique_owned`` the most a process writes in the raw
    plain-file limit (its even share of ``nbytes``).
    """

    nbytes: int
    owned: int
    layout: str = "fsdp"
    unique_owned: int = 0
    leaves: int = 0
    nb_blocked: list[float] = field(default_factory=list)
    nb_commit: list[float] = field(default_factory=list)
    nb_restore: list[float] = field(default_factory=list)
    nb_peak: list[float] = field(default_factory=list)
    ob_blocked: list[float] = field(default_factory=list)
    ob_commit: list[float] = field(default_factory=list)
    ob_restore: list[float] = field(default_factory=list)
    ob_peak: list[float] = field(default_factory=list)
    raw_write: list[float] = field(default_factory=list)
    raw_read: list[float] = field(default_factory=list)
    dd_write: list[float] = field(default_factory=list)
    lim_read: list[float] = field(default_factory=list)
    #: The plain-file writes, buffered and with O_DIRECT, one of each per repetition.
    lim_write_buffered: list[float] = field(default_factory=list)
    lim_write_direct: list[float] = field(default_factory=list)
    #: The step's own files (chunk files and packs) read plainly, evenly split.
    files_read: list[float] = field(default_factory=list)
    files_per_process: int = 0

    @property
    def lim_write(self) -> list[float]:
        """The plain-file write limit per repetition: the mode with the lower median.

        Which way of writing is faster is the disk's property, decided over the whole
        run. Taking the faster of the two within each repetition would take the
        smaller of two noisy draws each time against nbckpt's one, a limit biased low.
        """
        modes = [m for m in (self.lim_write_buffered, self.lim_write_direct) if m]
        return min(modes, key=statistics.median) if modes else []

    def drop_first(self, n: int) -> None:
        """Forget the first ``n`` repetitions' times: a run's untimed warm-up.

        Peak memory is kept: it is judged by its largest, and the warm-up's counts.
        """
        for name, value in vars(self).items():
            if isinstance(value, list) and not name.endswith("_peak"):
                del value[:n]


@dataclass
class JournalResult:
    """Durable-commit times with the journal on, off, and on with a parent tailer."""

    nbytes: int
    on: list[float] = field(default_factory=list)
    off: list[float] = field(default_factory=list)
    tailed: list[float] = field(default_factory=list)
    reads: int = 0


def gbps(nbytes: int, seconds: float) -> float:
    """GB/s (10^9 bytes per second)."""
    return nbytes / 1e9 / seconds if seconds > 0 else float("nan")


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.23x``, or n/a."""
    if not (a == a and b == b) or b == 0:  # NaN-safe
        return "n/a"
    return f"{a / b:.2f}x"


def paired_ratios(other: Sequence[float], nb: Sequence[float]) -> list[float]:
    """``other[i] / nb[i]`` for each repetition that measured both, sorted."""
    return sorted(o / b for o, b in zip(other, nb, strict=False) if b > 0 and o == o)


def spread(other: Sequence[float], nb: Sequence[float]) -> str:
    """nbckpt's speed over the other's, per repetition: ``median (min-max)``.

    Each repetition pairs the two times measured in it (``other[i] / nb[i]``: above 1
    nbckpt is faster), so the spread shows how much the noisy machine moved the ratio.
    """
    ratios = paired_ratios(other, nb)
    if not ratios:
        return "n/a"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def num(x: float, spec: str) -> str:
    """A number, or n/a for NaN."""
    return "n/a" if x != x else format(x, spec)


@dataclass
class Target:
    """One issue target: its name, the figure, the bound, whether it is met."""

    name: str
    figure: str
    bound: str
    met: bool | None


StateRow = tuple[SizeResult, SizeResult | None]
"""A state's figures and those of the ``fsdp`` state of the same size (None: not run)."""

#: The bound of the replicated restore's time over the sharded one's.
REPLICATED_BOUND = 1.3


def secs(x: float) -> str:
    """Seconds as ``1.23 s``, or n/a for NaN."""
    return f"{num(x, '.2f')} s"


def states_table(rows: Sequence[StateRow], processes: int, reps: int) -> list[str]:
    """The "States" section: every state and size against Orbax and the raw limit.

    Parameters
    ----------
    rows
        One per state and size, in report order, each with its ``fsdp`` reference.
    processes, reps
        For the heading.

    Returns
    -------
    list of str
        Markdown lines, ending with a blank one.
    """
    lines = [
        f"### States ({processes} processes, medians of {reps})",
        "",
        "| state | size | leaves | owned / unique share per process | save blocks: nbckpt | "
        "Orbax | durable save: nbckpt | Orbax | raw limit | nbckpt/raw | nbckpt/Orbax | "
        "cold restore: nbckpt | Orbax | raw read limit | nbckpt/raw | nbckpt/Orbax | "
        "restore / fsdp restore |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- | --- |",
    ]
    for s, ref in rows:
        n = s.nbytes
        nb_c, ob_c, lim_w = med(s.nb_commit), med(s.ob_commit), med(s.lim_write)
        nb_r, ob_r, lim_r = med(s.nb_restore), med(s.ob_restore), med(s.lim_read)
        vs_fsdp = ratio(nb_r, med(ref.nb_restore)) if ref is not None else "n/a"
        lines.append(
            f"| {s.layout} | {fmt_size(n)} | {s.leaves} "
            f"| {fmt_size(s.owned)} / {fmt_size(s.unique_owned)} "
            f"| {med(s.nb_blocked) * 1e3:.1f} ms | {num(med(s.ob_blocked) * 1e3, '.1f')} ms "
            f"| {secs(nb_c)} | {secs(ob_c)} | {secs(lim_w)} = {num(gbps(n, lim_w), '.2f')} "
            f"GB/s | {spread(s.lim_write, s.nb_commit)} | {spread(s.ob_commit, s.nb_commit)} "
            f"| {secs(nb_r)} | {secs(ob_r)} | {secs(lim_r)} = {num(gbps(n, lim_r), '.2f')} "
            f"GB/s | {spread(s.lim_read, s.nb_restore)} | {spread(s.ob_restore, s.nb_restore)} "
            f"| {vs_fsdp} |"
        )
    lines += [
        "",
        "Size is the state's unique bytes (a replicated byte counts once); a process owns "
        "its shards, replicas included. The raw limits write each unique byte once per "
        "job: every process writes its even share (the unique share) as one plain file "
        "(`os.write`, `fdatasync`, directory `fsync`; once buffered and once with "
        "`O_DIRECT`, in turns, the way with the lower median over the repetitions "
        "counting) and, after the page cache is "
        "dropped, reads it back, both timed between two barriers. nbckpt/raw is nbckpt's "
        "throughput over the limit's (higher is better, 1x is the limit), and nbckpt/Orbax "
        "its throughput over Orbax's: each the median over repetitions of the ratio within "
        "one repetition, with the smallest and largest in parentheses. The last column "
        "is nbckpt's cold restore time over that of the `fsdp` state of the same size "
        f"(the `replicated` state has the same bytes; target <= {REPLICATED_BOUND}x).",
        "",
        "The plain-file write of each state, both ways (medians): "
        + "; ".join(
            f"`{s.layout}` {fmt_size(s.nbytes)}: buffered "
            f"{num(med(s.lim_write_buffered) * 1e3, '.0f')} ms, "
            f"`O_DIRECT` {num(med(s.lim_write_direct) * 1e3, '.0f')} ms"
            for s, _ in rows
        )
        + ".",
        "",
    ]
    return lines


def size_targets(sizes: Sequence[SizeResult]) -> list[Target]:
    """The small-save, large-save and memory targets, over every ``fsdp`` size."""
    small, large = min(sizes, key=lambda s: s.nbytes), max(sizes, key=lambda s: s.nbytes)
    mid = min(sizes, key=lambda s: abs(s.nbytes - (1 << 30)))

    def rate(s: SizeResult) -> float:
        return gbps(s.nbytes, med(s.nb_commit))

    peak = max(max(s.nb_peak) / s.owned for s in sizes)
    return [
        Target(
            f"durable save vs raw tensorstore at {fmt_size(small.nbytes)}",
            ratio(rate(small), gbps(small.nbytes, med(small.raw_write))),
            ">= 0.8x",
            rate(small) >= 0.8 * gbps(small.nbytes, med(small.raw_write)),
        ),
        Target(
            f"durable save GB/s at {fmt_size(large.nbytes)} / at {fmt_size(mid.nbytes)}",
            ratio(rate(large), rate(mid)),
            ">= 0.9x",
            rate(large) >= 0.9 * rate(mid),
        ),
        Target(
            f"peak memory / owned bytes, {fmt_size(small.nbytes)} to {fmt_size(large.nbytes)}",
            f"{peak:.2f}",
            "<= 1.1",
            peak <= 1.1,
        ),
    ]


def replicated_target(rows: Sequence[StateRow], headline: SizeResult) -> Target:
    """Replicated restore over sharded restore of the same bytes, nearest the headline."""
    paired = [(s, ref) for s, ref in rows if s.layout == "replicated" and ref is not None]
    name, bound = "replicated restore / sharded restore", f"<= {REPLICATED_BOUND}x"
    if not paired:
        return Target(name, "n/a", bound, None)
    s, ref = min(paired, key=lambda p: abs(p[0].nbytes - headline.nbytes))
    rep_r, ref_r = med(s.nb_restore), med(ref.nb_restore)
    at = "" if s.nbytes == headline.nbytes else f" at {fmt_size(s.nbytes)}"
    known = rep_r == rep_r and ref_r == ref_r
    return Target(
        name,
        ratio(rep_r, ref_r) + at,
        bound,
        rep_r <= REPLICATED_BOUND * ref_r if known else None,
    )


def report(
    sizes: list[SizeResult],
    journal: JournalResult | None,
    barrier: list[tuple[float, float, float]],
    scaling: dict[int, tuple[float, float, int]],
    headline: SizeResult,
    processes: int,
    reps: int,
    states: Sequence[StateRow] = (),
) -> tuple[list[str], list[Target]]:
    """The tables (Markdown) and the targets."""
    lines: list[str] = []
    lines.append(f"### Save and cold restore ({processes} processes, medians of {reps})")
    lines.append("")
    lines.append(
        "| size | measure | nbckpt | Orbax | nbckpt/Orbax | raw tensorstore | "
        "dd+fdatasync | nbckpt/raw |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in sizes:
        n = s.nbytes
        nb_b, ob_b = med(s.nb_blocked), med(s.ob_blocked)
        nb_c, ob_c, raw_w, dd = (
            med(s.nb_commit),
            med(s.ob_commit),
            med(s.raw_write),
            med(s.dd_write),
        )
        nb_r, ob_r, raw_r = med(s.nb_restore), med(s.ob_restore), med(s.raw_read)
        z = fmt_size(n)
        lines.append(
            f"| {z} | `save` blocks | {nb_b * 1e3:.1f} ms | {num(ob_b * 1e3, '.1f')} ms | "
            f"{ratio(nb_b, ob_b)} (time) | | | |"
        )
        lines.append(
            f"| {z} | durable commit | {nb_c:.2f} s = {gbps(n, nb_c):.2f} GB/s | "
            f"{num(ob_c, '.2f')} s = {num(gbps(n, ob_c), '.2f')} GB/s | "
            f"{ratio(gbps(n, nb_c), gbps(n, ob_c))} | {gbps(n, raw_w):.2f} GB/s | "
            f"{gbps(n, dd):.2f} GB/s | {ratio(gbps(n, nb_c), gbps(n, raw_w))} |"
        )
        lines.append(
            f"| {z} | cold restore | {nb_r:.2f} s = {gbps(n, nb_r):.2f} GB/s | "
            f"{num(ob_r, '.2f')} s = {num(gbps(n, ob_r), '.2f')} GB/s | "
            f"{ratio(gbps(n, nb_r), gbps(n, ob_r))} | {gbps(n, raw_r):.2f} GB/s | | "
            f"{ratio(gbps(n, nb_r), gbps(n, raw_r))} |"
        )
        lines.append(
            f"| {z} | peak RSS above baseline / owned bytes ({fmt_size(s.owned)}) | "
            f"{max(s.nb_peak) / s.owned:.2f} | "
            f"{num(max(s.ob_peak, default=float('nan')) / s.owned, '.2f')} | | | | |"
        )
    lines.append("")
    lines.append(
        "Throughput ratios are nbckpt's GB/s over the other's (higher is better); the "
        "blocking ratio is nbckpt's time over Orbax's (lower is better). Peak memory is "
        "the largest over processes and repetitions, above the RSS at the start of the "
        "save less the memory of the host buffers nbckpt kept from the save before (what "
        "its copies wrote in them; they count)."
    )
    lines.append("")
    if states:
        lines += states_table(states, processes, reps)
    nb_runs, kv_runs, wab_runs = (list(x) for x in zip(*barrier, strict=True))
    nb_bar, kv_bar, wab = med(nb_runs), med(kv_runs), med(wab_runs)
    lines.append(
        f"### Barrier round trip ({processes} processes; {len(barrier)} rounds, each of the "
        "three kinds in rotating order; the median of each round's barriers, then the "
        "median (min-max) over the rounds; the ratios pair the kinds of one round)"
    )
    lines.append("")
    lines.append(
        "| nbckpt barrier | its key-value form alone (`fast_s=0`) | jax `wait_at_barrier` "
        "| nbckpt / jax | key-value form / jax |"
    )
    lines.append("| --- | --- | --- | --- | --- |")
    lines.append(
        f"| {nb_bar * 1e3:.2f} ms | {kv_bar * 1e3:.2f} ms | {wab * 1e3:.2f} ms "
        f"| {spread(nb_runs, wab_runs)} | {spread(kv_runs, wab_runs)} |"
    )
    lines.append("")
    lines.append(
        "The processes share one host, and have saved before: nbckpt's barrier meets at "
        "the host's hub (a Unix socket to the primary, `nbckpt.engine.sync.hostbarrier`), "
        "not at the service; `NBCKPT_HOST_BARRIER=0` keeps it at the service."
    )
    lines.append("")
    jo_pct = float("nan")
    if journal is not None:
        on, off, tailed = med(journal.on), med(journal.off), med(journal.tailed)
        jo_pct = (tailed - off) / off * 100
        lines.append(
            f"### Journal and live-view overhead ({fmt_size(journal.nbytes)}, durable commit)"
        )
        lines.append("")
        lines.append("| journal off | journal on | journal on + tailer every 0.25 s | overhead |")
        lines.append("| --- | --- | --- | --- |")
        lines.append(
            f"| {off:.3f} s | {on:.3f} s ({(on - off) / off * 100:+.1f} %) | {tailed:.3f} s "
            f"({journal.reads} journal reads) | {jo_pct:+.1f} % |"
        )
        lines.append("")
        lines.append(
            "The tailer re-reads `read_operation(root, op)` in the parent every 0.25 s, as "
            "the live widget does; the widget's rendering itself is measured by "
            "`benchmarks/widget_overhead.py` once that branch is merged."
        )
        lines.append("")
    scaling_spread = float("nan")
    if scaling:
        lines.append("### Throughput by process count (nbckpt, same total bytes)")
        lines.append("")
        lines.append("| processes | bytes | durable commit | cold restore |")
        lines.append("| --- | --- | --- | --- |")
        rates = []
        for n, (c, r, total) in sorted(scaling.items()):
            rates.append(gbps(total, c))
            lines.append(
                f"| {n} | {fmt_size(total)} | {c:.2f} s = {gbps(total, c):.2f} GB/s | "
                f"{r:.2f} s = {gbps(total, r):.2f} GB/s |"
            )
        scaling_spread = (max(rates) - min(rates)) / max(rates) * 100
        lines.append("")
        lines.append(f"Save throughput spread (max - min) / max: {scaling_spread:.1f} %.")
        lines.append("")

    h = headline
    n = h.nbytes
    nb_c, ob_c, raw_w = med(h.nb_commit), med(h.ob_commit), med(h.raw_write)
    nb_r, ob_r = med(h.nb_restore), med(h.ob_restore)
    nb_b, ob_b = med(h.nb_blocked), med(h.ob_blocked)
    peak = max(h.nb_peak) / h.owned
    orb = ob_c == ob_c

    def maybe(ok: bool) -> bool | None:
        return ok if orb else None

    targets = [
        Target(
            "durable save vs Orbax",
            ratio(gbps(n, nb_c), gbps(n, ob_c)),
            ">= 1.5x",
            maybe(gbps(n, nb_c) >= 1.5 * gbps(n, ob_c)),
        ),
        Target(
            "durable save vs raw tensorstore",
            ratio(gbps(n, nb_c), gbps(n, raw_w)),
            ">= 0.8x",
            gbps(n, nb_c) >= 0.8 * gbps(n, raw_w),
        ),
        Target(
            "cold restore vs Orbax",
            ratio(gbps(n, nb_r), gbps(n, ob_r)),
            ">= 3x",
            maybe(gbps(n, nb_r) >= 3 * gbps(n, ob_r)),
        ),
        Target("save blocks vs Orbax", ratio(nb_b, ob_b), "<= 1x", maybe(nb_b <= ob_b)),
        Target(
            "barrier round trip vs the service's `wait_at_barrier`",
            f"{nb_bar * 1e3:.2f} ms vs {wab * 1e3:.2f} ms",
            "<= 1x",
            nb_bar <= wab,
        ),
        Target(
            "journal + tailer overhead",
            f"{num(jo_pct, '+.1f')} %",
            "<= 2 %",
            None if jo_pct != jo_pct else jo_pct <= 2,
        ),
        Target("peak memory / owned bytes", f"{peak:.2f}", "<= 1.1", peak <= 1.1),
        Target(
            "1/2/4-process throughput spread",
            f"{num(scaling_spread, '.1f')} %",
            "<= 10 %",
            None if scaling_spread != scaling_spread else scaling_spread <= 10,
        ),
        replicated_target(states, headline),
        *size_targets(sizes),
    ]
    lines.append(f"### Targets (at {fmt_size(n)})")
    lines.append("")
    lines.append("| target | figure | bound | met |")
    lines.append("| --- | --- | --- | --- |")
    for t in targets:
        lines.append(
            f"| {t.name} | {t.figure} | {t.bound} | "
            f"{'n/a' if t.met is None else ('yes' if t.met else 'NO')} |"
        )
    lines.append("")
    return lines, targets


def summary(headline: SizeResult, targets: list[Target]) -> str:
    """The last line: every ratio and how many targets are met."""
    met = sum(1 for t in targets if t.met)
    judged = sum(1 for t in targets if t.met is not None)
    parts = ", ".join(f"{t.name} {t.figure}" for t in targets)
    return f"SUMMARY ({fmt_size(headline.nbytes)}): {parts}; targets met {met}/{judged}"


#: In the report, the line after which the text is written by hand: a new run keeps it.
KEEP_MARK = "<!-- compare.py keeps what follows: other benchmarks and notes, by hand -->"
