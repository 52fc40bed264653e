"""The shapes of what the server and the widget send: the view models, as typed dicts.

Python computes every value in them (:mod:`nbckpt.views.timeline`,
:mod:`nbckpt.views.answers`); the TypeScript side only draws them. Its types are
generated from these classes (:mod:`nbckpt.protocol.typescript`), so a field added
here reaches ``labextension/generated/nbckpt.d.ts`` with the next regeneration, and a
test fails until it does.

The merged journal itself (``OperationRecord.to_dict()``) and an inventory entry
(``Entry.to_dict()``) keep their dataclasses as their shapes; the answers that carry
them say what they add.
"""

from __future__ import annotations

from typing import TypedDict

from nbckpt.protocol.words import (
    Barrier,
    BarrierState,
    Cause,
    Event,
    Kind,
    Mode,
    Phase,
    Status,
    Tier,
)

__all__ = [
    "Activity",
    "ActivityOp",
    "Arrival",
    "BarrierCell",
    "BarrierSummary",
    "BarrierWait",
    "ClusterRoot",
    "EntryAnswer",
    "FoundRoot",
    "JobSummaryView",
    "OperationAnswer",
    "OperationSummary",
    "Operations",
    "PhaseCount",
    "PreemptionNotice",
    "ProcessDrawing",
    "ProtocolNames",
    "Roots",
    "Row",
    "TierChoice",
    "TierHost",
    "TierSettings",
    "TierStep",
    "TiersView",
    "TimelineView",
]


class PreemptionNotice(TypedDict):
    """Why a save was taken: a process was told to stop, and every process agreed a step.

    The save of the agreed step journals it in its ``requested`` event.
    """

    #: The process that was told (SIGTERM, or ``%ckpt_fault preempt``).
    process: int
    host: str
    #: What told it: ``SIGTERM``, or the reason given to ``PreemptionWatch.notify``.
    reason: str
    #: When it was told (wall time, seconds).
    time: float
    #: The step every process agreed to save.
    agreed: int


class ProtocolNames(TypedDict):
    """The protocol's words, as ``GET nbckpt/api/protocol`` and the widget send them.

    A ``dict[str, <enum>]`` is the enum by member name (``statuses["not_started"]``).
    """

    phases: list[str]
    barriers: list[Barrier]
    barrier_prefix: str
    events: list[Event]
    spans: list[tuple[Event, Event, Phase]]
    spans_by_kind: dict[str, list[tuple[Event, Event, Phase]]]
    end_statuses: list[str]
    statuses: dict[str, Status]
    kinds: list[Kind]
    kind_names: dict[str, Kind]
    causes: list[Cause]
    modes: list[Mode]
    phase_names: dict[str, Phase]
    barrier_states: dict[str, BarrierState]


# -- what a timeline draws besides the journal ---------------------------------------


class BarrierWait(TypedDict):
    """One process at one barrier wait of a timeline: whom it waited for."""

    state: BarrierState
    #: Those that entered the barrier after it (or, while it waits, not yet): eight at
    #: most, by index (those never seen first, then the last to arrive).
    processes: list[int]
    #: How many there are in all (``processes`` names a few of them at scale).
    count: int
    #: ``waited for 1, 2`` / ``waiting for 1`` / ``gave up on 1``; ``""`` for nobody.
    label: str
    #: The same without its verb (``for 1, 2``), for a narrow span.
    short: str


class ProcessDrawing(TypedDict):
    """What a timeline says about one process besides its spans."""

    #: Why its row is marked failed, in one sentence; None when it is not.
    failure: str | None
    #: Where the failure mark goes: the end of its failed spans, else its latest time.
    failed_at: float | None
    #: Each barrier wait it has, by phase name (``barrier:<name>``).
    waits: dict[str, BarrierWait]


class TimelineView(TypedDict):
    """The decisions of a timeline: when the step committed, who failed, who waited."""

    #: When the step became complete (the earliest end of a finalize), for a committed save.
    commit_time: float | None
    #: The latest wall time the journal shows (phase starts and ends).
    latest: float | None
    #: Every process, by index as a string, those that recorded nothing included.
    processes: dict[str, ProcessDrawing]


class OperationAnswer(TypedDict):
    """``GET nbckpt/api/operations/<op>`` adds these to the merged journal."""

    root: str
    time: float
    #: How lists name it: its kind, then a barrier's name or the step.
    label: str
    view: TimelineView
    #: Above 16 processes, the job as a whole; the journal and ``view`` then hold the
    #: processes that matter only (and the one asked for with ``?process=``).
    summary: JobSummaryView | None


# -- the sidebar's lists -------------------------------------------------------------


class EntryAnswer(TypedDict):
    """An inventory entry as ``GET nbckpt/api/checkpoints`` sends it: these added."""

    #: The writer's name to show beside the step (``Orbax``), None for nbckpt's own.
    format_label: str | None


class OperationSummary(TypedDict):
    """One operation in ``GET nbckpt/api/operations``."""

    op: str
    kind: str
    step: int | None
    #: A user barrier's name (None for saves and restores).
    name: str | None
    status: str
    start: float | None
    end: float | None
    process_count: int
    processes_seen: int
    #: How lists name it: its kind, then a barrier's name or the step.
    label: str


class Operations(TypedDict):
    """The answer of ``GET nbckpt/api/operations``, newest first."""

    root: str
    time: float
    operations: list[OperationSummary]


class ActivityOp(TypedDict):
    """An operation of a running cluster's root, as ``GET nbckpt/api/activity`` lists it."""

    op: str
    kind: str
    step: int | None
    name: str | None
    status: str
    start: float | None
    #: How lists name it: its kind, then a barrier's name or the step.
    label: str


class ClusterRoot(TypedDict):
    """A running cluster's root, and what runs or failed there since it registered."""

    #: As the sidebar opens it: relative to the server's root, or a URL.
    root: str
    #: As the notebook registered it (an absolute path or a URL).
    path: str
    #: False for a root the server may not read (outside its root, no credentials).
    openable: bool
    reason: str | None
    pid: int
    profile: str | None
    cluster_id: str | None
    since: float
    in_flight: list[ActivityOp]
    failed: list[ActivityOp]


class Activity(TypedDict):
    """The answer of ``GET nbckpt/api/activity``."""

    time: float
    clusters: list[ClusterRoot]


class FoundRoot(TypedDict):
    """A root found below the server's root."""

    root: str
    path: str


class Roots(TypedDict):
    """The answer of ``GET nbckpt/api/roots``."""

    time: float
    server_root: str
    clusters: list[ClusterRoot]
    found: list[FoundRoot]
    #: The scan stopped at its depth or time bound.
    truncated: bool


# -- the progress widget's table -----------------------------------------------------


class BarrierCell(TypedDict):
    """One barrier chip of a widget row."""

    name: str
    state: BarrierState
    text: str
    waiting_for: list[int]
    arrived_ms: float | None


class Column(TypedDict):
    """One column of the progress widget's table, chosen for the operation's kind.

    ``key`` says which cell of a :class:`Row` it shows: ``process``, ``phase``,
    ``bytes`` (saves and restores only), ``barriers`` or ``end``; ``label`` is its
    header (``written`` or ``read``; ``finalize / commit``, ``restored`` or
    ``released``).
    """

    key: str
    label: str


class Row(TypedDict):
    """One process's row of the progress widget (``rows_from_view``)."""

    process: int
    phase: str
    status: str
    bytes_written: int
    bytes_read: int
    bytes_total: int
    bytes_done: int
    #: The bytes column's verb: ``written`` for a save, ``read`` for a restore.
    bytes_verb: str
    fraction: float
    show_bytes: bool
    #: False where a bar would mislead (nothing of its own to write).
    show_bar: bool
    bytes_text: str
    #: The fill's colour role: the phase that moves the bytes (write, or read).
    fill_kind: str
    barriers: list[BarrierCell]
    end_text: str
    #: Why the row looks as it does, when that needs saying.
    note: str | None
    #: The note to show under the phase: None where the bytes or end cell says it.
    phase_note: str | None
    fault: str | None
    dead_reported_by: list[int]
    error: str | None
    error_phase: str | None


# -- the job as a whole (views of many processes) ----------------------------------


class Arrival(TypedDict):
    """One process's arrival at a barrier, in ms after the first arrival."""

    process: int
    ms: float


class BarrierSummary(TypedDict):
    """One barrier across the job: its arrivals as a spread, the last and the missing."""

    name: str
    arrived: int
    released: int
    median_ms: float
    p90_ms: float
    last_ms: float
    #: Arrivals per equal slice of ``[0, last_ms]``: the spread, to draw as bars.
    histogram: list[int]
    #: The last to arrive, latest first.
    slowest: list[Arrival]
    #: Who has not arrived while others wait: eight at most, and how many in all.
    missing: list[int]
    missing_count: int


class PhaseCount(TypedDict):
    """How many processes are in one phase."""

    phase: str
    count: int


class JobSummaryView(TypedDict):
    """The job as a whole, what a widget of many processes shows above its few rows."""

    process_count: int
    #: Where the job stands, or its failure (culprit first), in one line.
    headline: str
    phases: list[PhaseCount]
    barriers: list[BarrierSummary]
    failure: str | None
    #: The processes that keep a row (and a timeline lane): culprits, missing, slowest.
    notable: list[int]


# -- the local tier (``%ckpt_tiers``) ------------------------------------------------


class TierSettings(TypedDict):
    """A local tier's options, as a process reports them (``AsyncCheckpointer.set_tiers``)."""

    #: This process's local directory; None when it keeps no local tier.
    local_dir: str | None
    local_replicas: int
    persistent_every: int
    local_keep: int


class TierHost(TypedDict):
    """One host of the local tier: the processes that share its local directory."""

    #: The host's id (the id file in its local directory).
    host: str
    processes: list[int]
    local_dir: str | None


class TierStep(TypedDict):
    """One step of a root, and which tiers hold it."""

    step: int
    #: How many processes saved it (0 when no host holds it).
    processes: int
    #: Per live host (its id), the processes whose shards it holds a local copy of.
    holders: dict[str, list[int]]
    #: The processes whose shards no live host holds.
    missing: list[int]
    #: Whether the live hosts hold every process's shards: a restore can read it locally.
    recoverable: bool
    #: Whether the persistent root holds it complete; None where the notebook cannot tell.
    persistent: bool | None


class TierChoice(TypedDict):
    """What a restore of the newest step would read now, and from which tier."""

    step: int | None
    tier: Tier | None


class TiersView(TypedDict):
    """A root's local tier across the cluster, as ``%ckpt_tiers`` shows it."""

    root: str
    #: Process 0's options (its own local directory).
    settings: TierSettings
    #: The processes whose options, other than the directory, differ from process 0's.
    disagreeing: list[int]
    #: The processes that keep no local tier.
    without: list[int]
    #: The hosts of the processes that keep one, by their lowest process.
    hosts: list[TierHost]
    #: The steps any live host holds, and the root's newest, newest first.
    steps: list[TierStep]
    #: The root's complete steps, newest first; None where the notebook cannot tell.
    persistent_steps: list[int] | None
    restore: TierChoice
