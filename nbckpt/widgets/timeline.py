"""Timelines as matplotlib figures: one operation, or several on one time axis.

Its colours are the lab's (:mod:`nbckpt.widgets.palette`): the sidebar, the live widget
and this figure give each phase one hue. It draws in a light or a dark theme.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from nbckpt.journal import OperationRecord, PhaseSpan
from nbckpt.protocol import BARRIER_PREFIX, Event, Kind, Phase, Status
from nbckpt.session import reads
from nbckpt.views.aggregate import AGGREGATE_ABOVE, summarize
from nbckpt.views.monitor import view_state
from nbckpt.views.timeline import (
    NOT_FAILED,
    commit_time,
    everyone_of,
    failure_note,
    preempted,
    tiered,
)
from nbckpt.widgets.palette import LIGHT, Palette, ThemeName, lab_theme, palette, role_of

__all__ = ["PHASE_COLORS", "plot_timeline", "plot_timelines"]

#: The colour key (and legend word) shared by every barrier wait, ``barrier:<name>``.
_BARRIER = BARRIER_PREFIX.removesuffix(":")

#: Fill colour of each phase in the light theme (:data:`nbckpt.widgets.palette.LIGHT`);
#: every barrier is drawn hatched in the barrier colour.
PHASE_COLORS: dict[str, str] = {
    role: color for role, color in LIGHT.roles().items() if role not in (Status.FAILED, "commit")
}
#: The legend's order: a save's phases as they happen, a restore's reads among them.
_LEGEND_ORDER: tuple[str, ...] = (Phase.SNAPSHOT, Phase.READ, Phase.WRITE, _BARRIER, Phase.FINALIZE)
_BLOCKING: set[str] = {Phase.SNAPSHOT}  # what ``save`` waits for before it returns


def _load(
    source: OperationRecord | str | os.PathLike[str],
    op: str | None,
    reader: reads.Reader = reads.LOCAL,
) -> OperationRecord:
    if isinstance(source, OperationRecord):
        return source
    if op is None:
        raise ValueError("plot_timeline(root, op): name the operation when passing a root")
    record: OperationRecord = reader.run(reads.READ_OPERATION, source, op)
    return record


def _resolve(theme: str) -> ThemeName:
    if theme == "auto":
        return lab_theme() or "light"
    if theme not in ("light", "dark"):
        raise ValueError(f"plot_timeline(theme={theme!r}): use 'auto', 'light' or 'dark'")
    return "dark" if theme == "dark" else "light"


def _draw_span(
    ax: Axes, y: float, span: PhaseSpan, t0: float, end: float, p: int, pal: Palette
) -> None:
    x0 = span.start - t0
    width = max((span.end if span.end is not None else end) - span.start, 1e-4)
    barrier = span.name.startswith(BARRIER_PREFIX)
    failed = span.status == Status.FAILED
    color = pal.color(span.name)
    if barrier:
        # Stripes of the barrier colour over a faint wash of it, as in the lab; the
        # hatch takes the edge colour, so a failure's red outline is drawn on top.
        ax.broken_barh(
            [(x0, width)],
            (y - 0.35, 0.7),
            facecolors=(color, 0.22),
            edgecolor=color,
            hatch="////",
            linewidth=0.5,
            gid=f"{p}:{span.name}",
        )
        if failed:
            ax.broken_barh(
                [(x0, width)],
                (y - 0.35, 0.7),
                facecolors="none",
                edgecolor=pal.failed,
                linewidth=2.0,
                gid=f"{p}:{span.name}:failed",
            )
        return
    ax.broken_barh(
        [(x0, width)],
        (y - 0.35, 0.7),
        facecolors=color,
        alpha=1.0 if span.name in _BLOCKING else 0.9,
        edgecolor=pal.failed if failed else (pal.text if span.name in _BLOCKING else "none"),
        linewidth=2.0 if failed else 0.8,
        gid=f"{p}:{span.name}",
    )


def _beside(
    ax: Axes, x: float, y: float, after: Text, pad_px: float = 8.0
) -> Callable[[RendererBase], Bbox]:
    """Where a label goes: at data ``(x, y)``, pushed right of ``after`` if that overlaps.

    Measured when the figure is drawn, after its layout, so the labels of a short
    blocking part (a failed save's) never overlap however wide the figure is.
    """

    def where(renderer: RendererBase) -> Bbox:
        px, py = ax.transData.transform((x, y))
        px = max(px, after.get_window_extent(renderer).x1 + pad_px)
        return Bbox.from_bounds(px, py, 1, 1)

    return where


def _blocking_labels(ax: Axes, record: OperationRecord, t0: float, pal: Palette) -> None:
    """Shade the blocking part of a save and label it and the background part."""
    ends = [
        s.end for r in record.processes.values() for s in r.phases if s.name in _BLOCKING and s.end
    ]
    if not ends:
        return
    edge = max(ends) - t0
    snapshot = pal.color(Phase.SNAPSHOT)
    ax.axvspan(0, edge, color=snapshot, alpha=0.1, lw=0, gid="blocking")
    blocking = ax.text(
        0,
        -0.6,
        " blocking",
        color=snapshot,
        fontsize=8,
        va="bottom",
        ha="left",
        clip_on=False,
        gid="label:blocking",
    )
    ax.annotate(
        "background →",
        xy=(0, 0),
        xycoords=_beside(ax, edge, -0.6, blocking),
        color=pal.muted,
        fontsize=8,
        va="bottom",
        ha="left",
        annotation_clip=False,
        gid="label:background",
    )


def _release_labels(
    ax: Axes, exits: dict[str, float], t0: float, pal: Palette, span_s: float
) -> int:
    """A dashed line where each barrier released, labelled above the axes.

    Releases close together get their labels on separate lines, so they never overlap.
    Returns how many lines the labels take.
    """
    last_x: float | None = None
    level = lines = 0
    for name, t in sorted(exits.items(), key=lambda item: item[1]):
        x = t - t0
        ax.axvline(x, color=pal.muted, ls="--", lw=0.8, gid=f"release:{name}")
        level = level + 1 if last_x is not None and x - last_x < 0.22 * span_s else 0
        last_x = x
        lines = max(lines, level + 1)
        ax.annotate(
            f"{name} released",
            xy=(x, 1.0),
            xycoords=ax.get_xaxis_transform(),
            xytext=(2, 3 + 11 * level),
            textcoords="offset points",
            fontsize=7,
            color=pal.muted,
            va="bottom",
            ha="left",
            annotation_clip=False,
            gid=f"label:release:{name}",
        )
    return lines


def _style(fig: Figure, ax: Axes, pal: Palette) -> None:
    """Theme the figure: its face, axes, ticks, grid and title."""
    fig.patch.set_facecolor(pal.background or "none")
    fig.patch.set_alpha(1.0 if pal.background else 0.0)
    ax.set_facecolor(pal.background or "none")
    if pal.background is None:
        ax.patch.set_alpha(0.0)
    for spine in ax.spines.values():
        spine.set_color(pal.muted)
    ax.tick_params(colors=pal.text, which="both")
    ax.xaxis.label.set_color(pal.text)
    ax.grid(axis="x", alpha=0.3, color=pal.muted)


def _legend(ax: Axes, records: list[OperationRecord], pal: Palette) -> None:
    """The key of every phase drawn, the failure outline and the commit line, if shown."""
    processes = [r for record in records for r in record.processes.values()]
    shown = {role_of(s.name) for r in processes for s in r.phases}
    names = [n for n in _LEGEND_ORDER if n in shown] + sorted(shown - set(_LEGEND_ORDER))
    handles: list[Any] = [
        Patch(
            facecolor=(pal.color(n), 0.22) if n == _BARRIER else pal.color(n),
            edgecolor=pal.color(n) if n == _BARRIER else "none",
            hatch="////" if n == _BARRIER else None,
            label=(f"{_BARRIER} wait" if n == _BARRIER else n)
            + (" (blocking)" if n in _BLOCKING else ""),
        )
        for n in names
    ]
    if any(r.status not in NOT_FAILED for r in processes):
        handles.append(
            Patch(facecolor="none", edgecolor=pal.failed, lw=2, label=str(Status.FAILED))
        )
    if any(commit_time(record) is not None for record in records):
        handles.append(Line2D([], [], color=pal.commit, lw=2.0, label=str(Status.COMMITTED)))
    if handles:
        legend = ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            fontsize=8,
            facecolor=pal.background or "none",
            edgecolor=pal.muted,
            labelcolor=pal.text,
        )
        legend.get_frame().set_alpha(1.0 if pal.background else 0.0)


def _lanes(record: OperationRecord) -> tuple[list[int], str | None]:
    """The processes that get a lane, and above 16 processes the job in one line.

    A job of many processes gets lanes for the few that matter (the culprits, the
    missing, the slowest: :mod:`nbckpt.views.aggregate`), not a figure a metre tall.
    """
    procs = sorted(record.processes)
    if len(everyone_of(record)) <= AGGREGATE_ABOVE:
        return procs, None
    summary = summarize(view_state(record))
    shown = [p for p in summary.notable if p in record.processes]
    return shown, f"{summary.headline}; lanes: {len(shown)} of {summary.process_count:,}"


def plot_timeline(
    source: OperationRecord | str | os.PathLike[str],
    op: str | None = None,
    *,
    save: str | os.PathLike[str] | None = None,
    dpi: int = 110,
    theme: Literal["auto", "light", "dark"] = "auto",
    reader: reads.Reader = reads.LOCAL,
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
    reader
        Where a root's journal is read (a cluster's ``reader`` when only its hosts
        see it).
    theme
        ``"light"``: a white figure with dark text. ``"dark"``: a transparent figure
        with light text, in JupyterLab Dark's colours. ``"auto"`` (the default): the
        theme JupyterLab last saved in its user settings, when the kernel can read
        them (it runs on the same machine), else light. The kernel cannot see the page,
        so after switching themes, draw the figure again.

    Returns
    -------
    matplotlib.figure.Figure
        One row per process (process 0 on top; above 16 processes, only those that
        matter, with the job summed up under the title). Each phase is a span coloured by
        :mod:`nbckpt.widgets.palette` (the lab's colours for the same phase); barrier
        waits are hatched, and a dashed line marks where each barrier released. The
        blocking part of a save (the snapshot, before ``save`` returns) is shaded apart
        from the background part. A failed process's last phase is outlined in red
        and labelled with its error. Each span's ``gid`` is ``"<process>:<phase>"``.

    Notes
    -----
    The figure is built without pyplot, so it needs no display and no backend choice;
    saving uses Agg.
    """
    pal = palette(_resolve(theme))
    record = _load(source, op, reader)
    t0 = record.start or 0.0
    times = [float(e["t"]) for r in record.processes.values() for e in r.events if "t" in e]
    t_end = max(times) if times else t0
    procs, whole = _lanes(record)
    row = {p: i for i, p in enumerate(procs)}
    fig = Figure(figsize=(10, 1.6 + 0.55 * max(1, len(procs))), layout="constrained")
    ax = fig.add_subplot()
    _style(fig, ax, pal)
    _blocking_labels(ax, record, t0, pal)
    for p in procs:
        rec = record.processes[p]
        for span in rec.phases:
            _draw_span(ax, row[p], span, t0, t_end, p, pal)
        if rec.status not in NOT_FAILED:
            failed = [s for s in rec.phases if s.status == Status.FAILED] or rec.phases
            last = max(failed, key=lambda s: s.start) if failed else None
            x = ((last.end or t_end) if last else t_end) - t0
            ax.plot([x], [row[p]], marker="X", color=pal.failed, markersize=9, gid=f"failed:{p}")
            note = failure_note(record, p) or str(rec.status)
            msg = textwrap.shorten(note, 70, placeholder="…")
            ax.annotate(
                f"{last.name if last else rec.status}: {msg}",
                (x, row[p] + 0.36),
                ha="right",
                va="top",
                color=pal.failed,
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
    span_s = max(t_end - t0, 1e-3)
    lines = _release_labels(ax, exits, t0, pal, span_s)
    committed = commit_time(record)
    if committed is not None:
        ax.axvline(committed - t0, color=pal.commit, lw=2.0, gid="commit")
    ax.set_yticks(range(len(procs)), [f"process {p}" for p in procs])
    ax.set_ylim(len(procs) - 0.2, -0.8)
    ax.set_xlim(left=0, right=span_s * 1.05)
    ax.set_xlabel("seconds since the request")
    what = (
        f"{record.kind} of step {record.step}{preempted(record.preemption)}{tiered(record.tier)}"
        if record.kind != Kind.BARRIER
        else Kind.BARRIER
    )
    ax.set_title(
        f"{what}: {record.status}  ({record.op})" + (f"\n{whole}" if whole else ""),
        fontsize=10,
        loc="left",
        pad=20 + 11 * lines,
        color=pal.text,
    )
    _legend(ax, [record], pal)
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, format="png", dpi=dpi, facecolor=fig.get_facecolor())
    return fig


def plot_timelines(
    source: list[OperationRecord] | str | os.PathLike[str],
    ops: list[str] | None = None,
    *,
    save: str | os.PathLike[str] | None = None,
    dpi: int = 110,
    theme: Literal["auto", "light", "dark"] = "auto",
    reader: reads.Reader = reads.LOCAL,
) -> Figure:
    """Draw several operations on one time axis: a row per process, each save in place.

    What happens between two saves is the training: the gap shows how much of each
    save overlapped it (everything after the blocking snapshot).

    Parameters
    ----------
    source
        :class:`~nbckpt.journal.OperationRecord` s, or a checkpoint root (then ``ops``
        names the operations).
    ops
        The operation ids, when ``source`` is a root.
    save, dpi, theme, reader
        As for :func:`plot_timeline`.

    Returns
    -------
    matplotlib.figure.Figure
        Phases coloured as in :func:`plot_timeline`; above each operation its step
        (red where it failed) and, for a save, the blocking part shaded; a short line
        where each save committed (``gid`` ``"commit:<op>"``). Each span's ``gid`` is
        ``"<process>:<phase>"``, as in :func:`plot_timeline`.
    """
    if isinstance(source, list):
        records = list(source)
    else:
        if not ops:
            raise ValueError("plot_timelines(root, ops): name the operations when passing a root")
        records = [_load(source, op, reader) for op in ops]
    if not records:
        raise ValueError("plot_timelines: no operation to draw")
    pal = palette(_resolve(theme))
    records.sort(key=lambda r: r.start or 0.0)
    t0 = min(r.start or 0.0 for r in records)
    ends = [float(e["t"]) for r in records for p in r.processes.values() for e in p.events]
    t_end = max(ends, default=t0)
    procs = sorted({p for r in records for p in r.processes})
    fig = Figure(figsize=(12, 1.8 + 0.55 * max(1, len(procs))), layout="constrained")
    ax = fig.add_subplot()
    _style(fig, ax, pal)
    for record in records:
        own = [float(e["t"]) for p in record.processes.values() for e in p.events]
        end = max(own, default=record.start or t0)
        for p in procs:
            rec = record.processes.get(p)
            for span in rec.phases if rec is not None else []:
                _draw_span(ax, p, span, t0, end, p, pal)
        start = (record.start or t0) - t0
        blocking = [
            s.end
            for r in record.processes.values()
            for s in r.phases
            if s.name in _BLOCKING and s.end is not None
        ]
        if blocking:
            ax.axvspan(start, max(blocking) - t0, color=pal.color(Phase.SNAPSHOT), alpha=0.1, lw=0)
        failed = record.status == Status.FAILED
        what = f"step {record.step}" if record.step is not None else str(record.name or record.kind)
        ax.annotate(
            what + (f" {Status.FAILED}" if failed else ""),
            xy=(start, 1.0),
            xycoords=ax.get_xaxis_transform(),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=8,
            color=pal.failed if failed else pal.text,
            va="bottom",
            ha="left",
            annotation_clip=False,
            gid=f"label:{record.op}",
        )
        committed = commit_time(record)
        if committed is not None:
            ax.vlines(
                committed - t0,
                -0.45,
                len(procs) - 0.55,
                color=pal.commit,
                lw=2.0,
                gid=f"commit:{record.op}",
            )
    ax.set_yticks(procs, [f"process {p}" for p in procs])
    ax.set_ylim(len(procs) - 0.4, -0.6)
    ax.set_xlim(left=0, right=max(t_end - t0, 1e-3) * 1.02)
    ax.set_xlabel("seconds since the first request")
    kinds = "/".join(sorted({r.kind for r in records}))
    failures = sum(r.status == Status.FAILED for r in records)
    ax.set_title(
        f"{len(records)} {kinds}s, {failures} failed",
        fontsize=10,
        loc="left",
        pad=16,
        color=pal.text,
    )
    _legend(ax, records, pal)
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, format="png", dpi=dpi, facecolor=fig.get_facecolor())
    return fig
