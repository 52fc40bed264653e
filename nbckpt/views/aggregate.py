"""The job as a whole: what a view of many processes shows instead of one row each.

A row per process is what a student reads at 4 processes; at 1,024 nobody reads it.
Above :data:`AGGREGATE_ABOVE` processes the text views show a :class:`JobSummary`:
how many processes are in each phase, each barrier's arrivals as a spread (first,
median, 90th percentile, last) with the slowest and the missing by name, and a
headline that says where the job stands ("1,020 of 1,024 at barrier:write_complete;
waiting for 17, 233, 801, 1,002"). A failure is said once, its culprit first.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from nbckpt.protocol import Status
from nbckpt.protocol.views import BarrierSummary, JobSummaryView
from nbckpt.views.monitor import BarrierView, OperationView, ProcessView
from nbckpt.views.naming import NAMED, listing

__all__ = [
    "AGGREGATE_ABOVE",
    "BarrierSpread",
    "JobSummary",
    "summarize",
    "summary_lines",
    "summary_view",
]

#: Views of more processes than this show the job as a whole.
AGGREGATE_ABOVE = 16
#: How many slices a barrier's spread of arrivals is counted in.
HISTOGRAM_BINS = 24


@dataclass(frozen=True)
class BarrierSpread:
    """One barrier across the job.

    Attributes
    ----------
    name
        The barrier's name.
    arrived, released
        How many processes entered it, and how many left it.
    median_ms, p90_ms, last_ms
        Arrival times after the first arrival: the spread of the arrivals.
    slowest
        The last processes to arrive, latest first, each with its arrival in ms after
        the first (at most :data:`~nbckpt.views.naming.NAMED`).
    missing, missing_count
        The processes that have not arrived while others wait (named, and how many).
    histogram
        Arrivals per equal slice of ``[0, last_ms]`` (:data:`HISTOGRAM_BINS` slices).
    """

    name: str
    arrived: int
    released: int
    median_ms: float
    p90_ms: float
    last_ms: float
    slowest: list[tuple[int, float]]
    missing: list[int] = field(default_factory=list)
    missing_count: int = 0
    histogram: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class JobSummary:
    """Where a job of many processes stands: counts, spreads, and the few that matter."""

    process_count: int
    headline: str
    phases: list[tuple[str, int]]
    barriers: list[BarrierSpread]
    #: The failure, said once, its culprit first; None while nothing failed.
    failure: str | None
    #: The processes worth a row of their own: the dead, the failed, the slowest.
    notable: list[int]


def _spread(name: str, at: list[tuple[int, BarrierView]]) -> BarrierSpread:
    """Barrier ``name`` across the job, from each process's view of it."""
    arrivals = sorted((b.arrived, p) for p, b in at)
    t0 = arrivals[0][0]
    ms = [(t - t0) * 1e3 for t, _ in arrivals]
    # Every process still waiting sees the same processes missing.
    waiting = next((b for _, b in at if b.released is None), None)
    return BarrierSpread(
        name=name,
        arrived=len(arrivals),
        released=sum(1 for _, b in at if b.released),
        median_ms=statistics.median(ms),
        p90_ms=ms[min(len(ms) - 1, int(0.9 * len(ms)))],
        last_ms=ms[-1],
        slowest=[(p, m) for (_, p), m in zip(arrivals[-NAMED:][::-1], ms[::-1], strict=False)],
        missing=list(waiting.waiting_for) if waiting else [],
        missing_count=waiting.waiting_count if waiting else 0,
        histogram=_histogram(ms),
    )


def _histogram(ms: list[float]) -> list[int]:
    bins = [0] * HISTOGRAM_BINS
    width = (ms[-1] / HISTOGRAM_BINS) if ms and ms[-1] > 0 else 0.0
    for m in ms:
        bins[min(HISTOGRAM_BINS - 1, int(m / width)) if width else 0] += 1
    return bins


def _failure(views: list[ProcessView]) -> tuple[str | None, list[int]]:
    """The failure in one sentence, the culprit first; and who it involves."""
    dead = [p for p in views if p.status == Status.DEAD]
    failed = [p for p in views if p.status == Status.FAILED]
    if dead:
        named = listing([p.process for p in dead[:NAMED]], len(dead))
        why = dead[0].note or "no heartbeat"
        verb = "died" if len(dead) == 1 else "died or became unreachable"
        culprit = f"process{'es' if len(dead) > 1 else ''} {named} {verb} ({why})"
    elif failed:
        first = min(failed, key=lambda p: p.last_event or 0.0)
        culprit = f"process {first.process} failed during {first.error_phase or '?'}: {first.error}"
    else:
        return None, []
    culprits = [p.process for p in dead] if dead else [first.process]
    gave_up = [p.process for p in failed if p.process not in culprits]
    tail = f"; {len(gave_up):,} of {len(views):,} gave up" if gave_up else ""
    return culprit + tail, culprits + gave_up


def summarize(view: OperationView) -> JobSummary:
    """The job of ``view`` as a whole (see the module's description)."""
    views = view.processes
    n = len(views)
    phases = Counter(p.phase for p in views)
    order = list(dict.fromkeys(p.phase for p in views))
    # One pass over every process's barriers, grouped by name in the order first met.
    at: dict[str, list[tuple[int, BarrierView]]] = {}
    for p in views:
        for b in p.barriers:
            at.setdefault(b.name, []).append((p.process, b))
    barriers = [_spread(name, found) for name, found in at.items()]
    failure, involved = _failure(views)
    if failure is not None:
        headline = failure
    elif view.status != Status.RUNNING:
        headline = f"{phases.get(view.status, 0):,} of {n:,} {view.status}"
    else:
        top, count = phases.most_common(1)[0]
        headline = f"{count:,} of {n:,} at {top}"
        open_ = next((b for b in reversed(barriers) if b.missing_count), None)
        if open_ is not None:
            headline += f"; waiting for {listing(open_.missing, open_.missing_count)}"
    # Those a reader opens first: the culprits, then who is missing, then the slowest.
    open_missing = next((b.missing for b in reversed(barriers) if b.missing_count), [])
    # The barrier the job waited at longest is where its straggler shows.
    worst = max(barriers, key=lambda b: b.last_ms, default=None)
    slowest = [p for p, _ in worst.slowest] if worst is not None else []
    notable = list(dict.fromkeys([*involved[:NAMED], *open_missing, *slowest]))[:NAMED]
    return JobSummary(
        process_count=n,
        headline=headline,
        phases=[(phase, phases[phase]) for phase in order],
        barriers=barriers,
        failure=failure,
        notable=notable,
    )


def summary_view(summary: JobSummary) -> JobSummaryView:
    """The summary as the widget's ``summary`` trait (JSON; drawn by TypeScript)."""
    barriers: list[BarrierSummary] = [
        {
            "name": b.name,
            "arrived": b.arrived,
            "released": b.released,
            "median_ms": round(b.median_ms, 1),
            "p90_ms": round(b.p90_ms, 1),
            "last_ms": round(b.last_ms, 1),
            "histogram": b.histogram,
            "slowest": [{"process": p, "ms": round(ms, 1)} for p, ms in b.slowest],
            "missing": b.missing,
            "missing_count": b.missing_count,
        }
        for b in summary.barriers
    ]
    return {
        "process_count": summary.process_count,
        "headline": summary.headline,
        "phases": [{"phase": phase, "count": k} for phase, k in summary.phases],
        "barriers": barriers,
        "failure": summary.failure,
        "notable": summary.notable,
    }


def summary_lines(summary: JobSummary) -> list[str]:
    """The summary as text: headline, phase counts, one line per barrier."""
    lines = [summary.headline]
    lines.append("phases: " + ", ".join(f"{phase} {k:,}" for phase, k in summary.phases))
    for b in summary.barriers:
        line = (
            f"{b.name}: {b.arrived:,} arrived, {b.released:,} released; arrivals over "
            f"{b.last_ms:,.0f} ms (median +{b.median_ms:,.0f}, 90% +{b.p90_ms:,.0f})"
        )
        if b.slowest:
            line += "; last: " + ", ".join(f"{p} (+{ms:,.0f} ms)" for p, ms in b.slowest[:4])
        lines.append(line)
    return lines
