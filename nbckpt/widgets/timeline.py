"""The timeline of one operation: a matplotlib figure with one row per process."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from nbckpt import reads
from nbckpt.journal import OperationRecord, PhaseSpan
from nbckpt.protocol import BARRIER_PREFIX, Event, Kind, Phase, Status

__all__ = ["PHASE_COLORS", "plot_timeline"]

#: The colour key (and legend word) shared by every barrier wait, ``barrier:<name>``.
_BARRIER = BARRIER_PREFIX.removesuffix(":")

#: Fill colour of each phase; every barrier is drawn hatched in the barrier colour.
PHASE_COLORS: dict[str, str] = {
    Phase.SNAPSHOT: "#d62728",
    Phase.WRITE: "#1f77b4",
    Phase.FINALIZE: "#9467bd",
    Phase.READ: "#17becf",
    _BARRIER: "#f2b701",
}
_BLOCKING: set[str] = {Phase.SNAPSHOT}  # what ``save`` waits for before it returns


def _key(name: str) -> str:
    """The colour key of a phase: its name, or the barrier key for a barrier wait."""
    return _BARRIER if name.startswith(BARRIER_PREFIX) else name


def _color(name: str) -> str:
    return PHASE_COLORS.get(_key(name), "#7f7f7f")


def _load(source: OperationRecord | str | os.PathLike[str], op: str | None) -> OperationRecord:
    if isinstance(source, OperationRecord):
        return source
    if op is None:
        raise ValueError("plot_timeline(root, op): name the operation when passing a root")
    record: OperationRecord = reads.run(reads.READ_OPERATION, source, op)
    return record


def _draw_span(ax: object, y: float, span: PhaseSpan, t0: float, end: float, p: int) -> None:
    x0 = span.start - t0
    width = max((span.end if span.end is not None else end) - span.start, 1e-4)
    barrier = span.name.startswith(BARRIER_PREFIX)
    failed = span.status == Status.FAILED
    ax.broken_barh(  # type: ignore[attr-defined]
        [(x0, width)],
        (y - 0.35, 0.7),
        facecolors=_color(span.name),
        alpha=1.0 if span.name in _BLOCKING else (0.55 if barrier else 0.85),
        hatch="////" if barrier else None,
        edgecolor="#c62828" if failed else ("#333333" if span.name in _BLOCKING else "none"),
        linewidth=2.0 if failed else 0.8,
        gid=f"{p}:{span.name}",
    )


def plot_timeline(
    source: OperationRecord | str | os.PathLike[str],
    op: str | None = None,
    *,
    save: str | os.PathLike[str] | None = None,
    dpi: int = 110,
) -> Figure:
    """Draw one operation per process: phases, barrier waits and releases, failures.

    Parameters
    ----------
    source
        An :class:`~nbckpt.journal.OperationRecord`, or a checkpoint root (then ``op``
        names the operation).
    op
        The operation id, when ``source`` is a root.
    save
        If given, also write the figure there as PNG.
    dpi
        Resolution of the saved PNG.

    Returns
    -------
    matplotlib.figure.Figure
        One row per process (process 0 on top). Each phase is a span coloured by
        :data:`PHASE_COLORS`; barrier waits are hatched, and a dashed line marks where
        each barrier released. The blocking part of a save (the snapshot, before
        ``save`` returns) is shaded apart from the background part. A failed process's
        last phase is outlined in red and labelled with its error. Each span's
        ``gid`` is ``"<process>:<phase>"``.

    Notes
    -----
    The figure is built without pyplot, so it needs no display and no backend choice;
    saving uses Agg.
    """
    record = _load(source, op)
    t0 = record.start or 0.0
    times = [float(e["t"]) for r in record.processes.values() for e in r.events if "t" in e]
    t_end = max(times) if times else t0
    procs = sorted(record.processes)
    fig = Figure(figsize=(10, 1.6 + 0.55 * max(1, len(procs))), layout="constrained")
    ax = fig.add_subplot()
    # The blocking part: from the request until the last process's snapshot is done.
    blocking = [
        s.end for r in record.processes.values() for s in r.phases if s.name in _BLOCKING and s.end
    ]
    if blocking:
        ax.axvspan(0, max(blocking) - t0, color="#d62728", alpha=0.07, lw=0, gid="blocking")
        ax.text(
            0, -0.6, " blocking", color="#b71c1c", fontsize=8, va="bottom", ha="left", clip_on=False
        )
        ax.text(
            max(blocking) - t0,
            -0.6,
            " background →",
            color="#555555",
            fontsize=8,
            va="bottom",
            ha="left",
            clip_on=False,
        )
    for p in procs:
        rec = record.processes[p]
        for span in rec.phases:
            _draw_span(ax, p, span, t0, t_end, p)
        if rec.status == Status.FAILED:
            failed = [s for s in rec.phases if s.status == Status.FAILED] or rec.phases
            last = max(failed, key=lambda s: s.start) if failed else None
            x = ((last.end or t_end) if last else t_end) - t0
            ax.plot([x], [p], marker="X", color="#c62828", markersize=9, gid=f"failed:{p}")
            msg = textwrap.shorten(rec.error or Status.FAILED, 70, placeholder="…")
            ax.annotate(
                f"{last.name if last else Status.FAILED}: {msg}",
                (x, p + 0.36),
                ha="right",
                va="top",
                color="#c62828",
                fontsize=8,
                annotation_clip=False,
                gid=f"error:{p}",
            )
    # Where each barrier released: the first exit of any process.
    exits: dict[str, float] = {}
    for rec in record.processes.values():
        for e in rec.events:
            if e.get("event") == Event.BARRIER_EXIT:
                name = str(e.get("name"))
                exits[name] = min(exits.get(name, float("inf")), float(e["t"]))
    for name, t in exits.items():
        ax.axvline(t - t0, color="#555555", ls="--", lw=0.8, gid=f"release:{name}")
        ax.text(
            t - t0,
            1.01,
            f"{name} released",
            transform=ax.get_xaxis_transform(),
            rotation=25,
            fontsize=7,
            color="#555555",
            va="bottom",
            ha="left",
        )
    ax.set_yticks(procs, [f"process {p}" for p in procs])
    ax.set_ylim(len(procs) - 0.2, -0.8)
    ax.set_xlim(left=0, right=max(t_end - t0, 1e-3) * 1.05)
    ax.set_xlabel("seconds since the request")
    what = f"{record.kind} of step {record.step}" if record.kind != Kind.BARRIER else Kind.BARRIER
    ax.set_title(f"{what}: {record.status}  ({record.op})", fontsize=10, loc="left", pad=40)
    ax.grid(axis="x", alpha=0.3)
    names = sorted({_key(s.name) for r in record.processes.values() for s in r.phases})
    handles = [
        Patch(
            facecolor=_color(n),
            hatch="////" if n == _BARRIER else None,
            alpha=0.55 if n == _BARRIER else 0.85,
            label=(f"{_BARRIER} wait" if n == _BARRIER else n)
            + (" (blocking)" if n in _BLOCKING else ""),
        )
        for n in names
    ]
    if any(r.status == Status.FAILED for r in record.processes.values()):
        handles.append(Patch(facecolor="white", edgecolor="#c62828", lw=2, label=Status.FAILED))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, format="png", dpi=dpi)
    return fig
