"""Issue 29's "done when", judged from the figures of one ``compare.py`` run.

Each goal is judged on the median over repetitions of the ratio within a repetition
(:func:`~_compare_report.spread`), which the machine's noise moves less than a ratio
of medians; the smallest and largest are shown beside it. A goal whose state or size
was not run reads "not run", and is not judged.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from _compare_report import SizeResult, StateRow, Target, fmt_size, paired_ratios, spread

#: (state, nominal size, bound) for the plain-file limit, save and restore alike.
STATE_GOALS = (
    ("small", 256 << 20, 0.8),
    ("small", 1 << 30, 0.8),
    ("transformer", 256 << 20, 0.8),
    ("transformer", 1 << 30, 0.8),
    ("fsdp", 1 << 30, 0.9),
)
#: The most memory a process may use, over the bytes it owns.
MEMORY_BOUND = 1.1
#: A state of ``nbytes`` stands for a goal's size if within this factor of it (the
#: ``transformer`` state "of 256 MiB" holds 216 MiB).
SIZE_SLACK = 1.25


def paired(other: Sequence[float], nb: Sequence[float]) -> float:
    """Median over repetitions of ``other[i] / nb[i]`` (NaN without data)."""
    ratios = paired_ratios(other, nb)
    return statistics.median(ratios) if ratios else float("nan")


def _near(rows: Sequence[SizeResult], layout: str, nominal: int) -> SizeResult | None:
    """The run of ``layout`` nearest ``nominal`` bytes, if within :data:`SIZE_SLACK`."""
    lo, hi = nominal / SIZE_SLACK, nominal * SIZE_SLACK
    runs = [r for r in rows if r.layout == layout and lo <= r.nbytes <= hi]
    return min(runs, key=lambda r: abs(r.nbytes - nominal), default=None)


def _measures(run: SizeResult) -> dict[str, tuple[list[float], list[float]]]:
    """Per measure: the limit's and Orbax's times, and nbckpt's."""
    return {
        "save": (run.lim_write, run.nb_commit),
        "restore": (run.lim_read, run.nb_restore),
        "orbax save": (run.ob_commit, run.nb_commit),
        "orbax restore": (run.ob_restore, run.nb_restore),
    }


def goals(
    sizes: Sequence[SizeResult],
    states: Sequence[StateRow],
    barrier: Sequence[tuple[float, float, float]],
) -> list[Target]:
    """Every goal of issue 29's "done when", with its figure and whether it is met."""
    rows = [*sizes, *(s for s, _ in states if s.layout != "fsdp")]
    out: list[Target] = []
    for layout, nominal, bound in STATE_GOALS:
        run = _near(rows, layout, nominal)
        for what in ("save", "restore"):
            name = f"`{layout}` {fmt_size(nominal)} durable {what} vs the plain-file limit"
            if run is None:
                out.append(Target(name, "not run", f">= {bound}x", None))
                continue
            limit, nb = _measures(run)[what]
            got = paired(limit, nb)
            at = "" if run.nbytes == nominal else f" at {fmt_size(run.nbytes)}"
            met = None if got != got else got >= bound
            out.append(Target(name, spread(limit, nb) + at, f">= {bound}x", met))
    if barrier:
        nb_runs, _, wab_runs = (list(x) for x in zip(*barrier, strict=True))
        got = paired(nb_runs, wab_runs)
        met = None if got != got else got <= 1.0
        name = "barrier round trip / jax `wait_at_barrier`"
        out.append(Target(name, spread(nb_runs, wab_runs), "<= 1.0x", met))
    # Ahead of Orbax: the lowest of nbckpt's save and restore ratios over every state.
    worst: tuple[float, str] | None = None
    for run in rows:
        for what in ("orbax save", "orbax restore"):
            other, nb = _measures(run)[what]
            got = paired(other, nb)
            if got == got and (worst is None or got < worst[0]):
                where = f"`{run.layout}` {fmt_size(run.nbytes)} {what.split()[1]}"
                worst = (got, f"{spread(other, nb)}, {where}")
    out.append(
        Target(
            "ahead of Orbax on every state (the lowest nbckpt/Orbax)",
            "n/a" if worst is None else worst[1],
            "> 1x",
            None if worst is None else worst[0] > 1,
        )
    )
    out.append(_memory(rows))
    return out


def _memory(rows: Sequence[SizeResult]) -> Target:
    """Peak memory over owned bytes, judged on every state of the goals' sizes.

    A smaller state's worst is shown beside it: there what a save holds per leaf
    (metadata, checksums) weighs against few bytes per leaf (the 4,006-leaf state at
    64 MiB, 16 MiB a process).
    """
    sizes = {nominal for _, nominal, _ in STATE_GOALS}

    def judged(r: SizeResult) -> bool:
        return any(n / SIZE_SLACK <= r.nbytes <= n * SIZE_SLACK for n in sizes)

    peaks = [(max(r.nb_peak) / r.owned, r) for r in rows if r.nb_peak and r.owned]
    big = max((p for p in peaks if judged(p[1])), key=lambda p: p[0], default=None)
    small = max((p for p in peaks if not judged(p[1])), key=lambda p: p[0], default=None)
    name = "peak memory per process / owned bytes, every state of those sizes"
    figure = "n/a" if big is None else f"{big[0]:.2f} (`{big[1].layout}` {fmt_size(big[1].nbytes)})"
    if small is not None:
        figure += f"; smaller: {small[0]:.2f} (`{small[1].layout}` {fmt_size(small[1].nbytes)})"
    return Target(
        name, figure, f"<= {MEMORY_BOUND}", None if big is None else big[0] <= MEMORY_BOUND
    )


def goals_table(targets: Sequence[Target]) -> list[str]:
    """The goals as a Markdown table, ending with a blank line."""
    lines = [
        "### Issue 29: done when",
        "",
        "Each figure is the median over repetitions of the ratio within one repetition "
        "(nbckpt's throughput over the other's: 1x is the limit), with the smallest and "
        "largest in parentheses; the goal is judged on the median.",
        "",
        "| goal | figure | bound | met |",
        "| --- | --- | --- | --- |",
    ]
    for t in targets:
        met = "n/a" if t.met is None else ("yes" if t.met else "NO")
        lines.append(f"| {t.name} | {t.figure} | {t.bound} | {met} |")
    lines.append("")
    return lines
