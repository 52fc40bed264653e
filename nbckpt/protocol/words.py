"""Every word and id of the nbckpt protocol, in one place (no jax, no IPython).

The engine writes these words into the journal and the key-value store; the journal
readers, the views, the server and (through the server's ``/nbckpt/api/protocol``
route) the TypeScript sidebar read them back. Nothing else spells them: a module that
needs a phase, an event, a status or an op id imports it from here.

The data path these names travel::

    notebook (magics -> client) --ipyparallel--> engine (agent -> checkpointer)
        -> storage (tensorstore arrays, metadata, commit)   <root>/<step>/...
        -> journal (one JSONL file per process per op)      <root>/.nbckpt/ops/<op>/
        -> views (monitor -> widgets, timeline, server -> lab sidebar)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from nbckpt.protocol.views import ProtocolNames

__all__ = [
    "BARRIERS",
    "DEFAULT_BARRIER_TIMEOUT_S",
    "FAULTS",
    "FAULT_ACTIONS",
    "DEFAULT_SAVE_TIMEOUT_S",
    "DIR_ENV",
    "DIR_NAME",
    "END_STATUS",
    "END_STATUSES",
    "FORMATS",
    "HOST_BARRIER_ENV",
    "MODES",
    "NBCKPT_FORMAT",
    "ORBAX_FORMAT",
    "PHASES",
    "PROCESS_PLACEHOLDER",
    "READ_BARRIER",
    "SPANS",
    "SPANS_BY_KIND",
    "TIER_PHASES",
    "Barrier",
    "BarrierState",
    "Cause",
    "Event",
    "Kind",
    "Mode",
    "OpId",
    "Phase",
    "SaveFormat",
    "Status",
    "Tier",
    "TierBarrier",
    "as_json",
    "barrier_key",
    "barrier_phase",
    "check_name",
    "check_optional_timeout",
    "check_timeout",
    "new_op_id",
    "parse_op_id",
]


class Phase(StrEnum):
    """What a process is doing; fault hooks fire as each save phase starts."""

    SNAPSHOT = "snapshot"
    PREPARE = "prepare"
    WRITE = "write"
    FINALIZE = "finalize"
    RETENTION = "retention"
    READ = "read"
    #: The local tier (issue 28): each host's own copy, then the copies of its peers.
    LOCAL_WRITE = "local_write"
    REPLICATE = "replicate"
    #: A restore from the local tier gets what its host lacks from a peer.
    FETCH = "fetch"


class Barrier(StrEnum):
    """The barriers of a save, in order."""

    TMP_READY = "tmp_ready"
    WRITE_COMPLETE = "write_complete"
    COMMIT_COMPLETE = "commit_complete"


class TierBarrier(StrEnum):
    """The barriers of the local tier, in order (see :mod:`nbckpt.engine.tiers`).

    Every process meets them after its snapshot, before the persistent barriers of a
    save that also goes to the root: past ``replicated`` the step is recoverable from
    the live hosts' local directories.
    """

    LOCAL_READY = "local_ready"
    LOCAL_WRITTEN = "local_written"
    LOCAL_COMMITTED = "local_committed"
    REPLICATED = "replicated"
    #: A restore from the local tier: every process has fetched what it needs from its
    #: peers and read it (until then each keeps serving its host's copy).
    FETCHED = "fetched"


class Tier(StrEnum):
    """Where a restore read a step from: its hosts' local copies, or the root."""

    LOCAL = "local"
    PERSISTENT = "persistent"


#: What a local tier's directory may hold to give each process a directory of its own
#: (each engine puts its process index there), for processes that share one machine.
PROCESS_PLACEHOLDER = "{process}"


class BarrierState(StrEnum):
    """Where one process stands at one barrier: the one word every view draws it by.

    The widget's barrier chips, the timeline's barrier spans (their labels: waited
    for, waiting for, gave up on) and the text views all say it with these.
    """

    RELEASED = "released"
    WAITING = "waiting"
    #: It gave up there (it failed, or died, while waiting).
    FAILED = "failed"


#: The barrier a restore meets before its processes exchange the pieces of replicated
#: leaves (:mod:`nbckpt.engine.restore.exchange`): past it, every process has read its own.
READ_BARRIER: Final = "read_complete"

#: The prefix of a barrier wait's phase name: ``barrier:<name>``.
BARRIER_PREFIX: Final = "barrier:"


def barrier_phase(name: str) -> str:
    """Return the phase name of waiting at barrier ``name`` (``barrier:<name>``)."""
    return f"{BARRIER_PREFIX}{name}"


#: What ``%ckpt_fault`` injects (``preempt``: the notice a preemptible machine gets).
FAULTS: Final = ("kill", "stall", "slow-io", "fail-io", "preempt")
#: What ``%ckpt_fault`` takes: a fault, or ``list`` / ``clear``.
FAULT_ACTIONS: Final = (*FAULTS, "list", "clear")

#: The phases of a save, in order; ``%ckpt_fault --at`` takes one of these.
PHASES: Final[tuple[str, ...]] = (
    Phase.SNAPSHOT,
    Phase.PREPARE,
    barrier_phase(Barrier.TMP_READY),
    Phase.WRITE,
    barrier_phase(Barrier.WRITE_COMPLETE),
    Phase.FINALIZE,
    barrier_phase(Barrier.COMMIT_COMPLETE),
)

BARRIERS: Final[tuple[str, ...]] = tuple(Barrier)

#: The phases of a save's local tier, in order: a fault can fire at each, as at
#: :data:`PHASES` (a save without a local tier passes none of them).
TIER_PHASES: Final[tuple[str, ...]] = (
    Phase.LOCAL_WRITE,
    barrier_phase(TierBarrier.LOCAL_READY),
    barrier_phase(TierBarrier.LOCAL_WRITTEN),
    barrier_phase(TierBarrier.LOCAL_COMMITTED),
    Phase.REPLICATE,
    barrier_phase(TierBarrier.REPLICATED),
)


class Event(StrEnum):
    """The events a process journals, in the order a successful save emits them.

    Restores use ``requested``, ``read_started``, ``read_progress``, ``read_done`` and
    ``restored``; ``write_progress`` repeats while shards are written, and
    ``read_progress`` while a restore reads them (``bytes`` done of ``total``). A save
    of the step agreed after a preemption notice ends, on each process that waited for
    it, with ``preemption_saved``: the process may now stop.
    """

    REQUESTED = "requested"
    SNAPSHOT_DONE = "snapshot_done"
    TMP_READY = "tmp_ready"
    WRITE_STARTED = "write_started"
    WRITE_PROGRESS = "write_progress"
    WRITE_DONE = "write_done"
    BARRIER_ENTER = "barrier_enter"
    BARRIER_EXIT = "barrier_exit"
    FINALIZE_STARTED = "finalize_started"
    FINALIZED = "finalized"
    COMMITTED = "committed"
    FAILED = "failed"
    READ_STARTED = "read_started"
    READ_PROGRESS = "read_progress"
    READ_DONE = "read_done"
    RESTORED = "restored"
    PREEMPTION_SAVED = "preemption_saved"
    #: A host leader committed its host's local copy (``host``, ``processes``).
    LOCAL_COMMITTED = "local_committed"
    #: A host leader holds a peer host's shards (``origin``, ``processes``, ``bytes``).
    REPLICATED = "replicated"
    #: Which tier and step a restore reads, and why (``tier``, ``why``).
    TIER_CHOSEN = "tier_chosen"
    #: Shards a restore got from a peer (``peer``, ``host``, ``processes``, ``bytes``).
    FETCHED = "fetched"


#: (start event, end event, phase) of each span a view draws, of any kind; barrier
#: waits are paired by their ``name`` field instead. :data:`SPANS_BY_KIND` says which
#: of them each kind of operation records.
SPANS: Final[tuple[tuple[Event, Event, Phase], ...]] = (
    (Event.REQUESTED, Event.SNAPSHOT_DONE, Phase.SNAPSHOT),
    (Event.WRITE_STARTED, Event.WRITE_DONE, Phase.WRITE),
    (Event.FINALIZE_STARTED, Event.FINALIZED, Phase.FINALIZE),
    (Event.READ_STARTED, Event.READ_DONE, Phase.READ),
)


class Kind(StrEnum):
    """The kinds of operation that get a journal."""

    SAVE = "save"
    RESTORE = "restore"
    BARRIER = "barrier"


#: The spans of each kind of operation. Only a save snapshots (a restore's or a
#: barrier's ``requested`` opens nothing), and only a restore reads.
SPANS_BY_KIND: Final[dict[str, tuple[tuple[Event, Event, Phase], ...]]] = {
    Kind.SAVE: SPANS[:3],
    Kind.RESTORE: (SPANS[3],),
    Kind.BARRIER: (),
}


class Status(StrEnum):
    """Where an operation (or one process of it) stands."""

    NOT_STARTED = "not started"
    RUNNING = "running"
    COMMITTED = "committed"
    RESTORED = "restored"
    FAILED = "failed"
    #: A barrier operation that every process passed: a barrier is released, never
    #: committed (its journal still ends with the ``committed`` event it always had).
    RELEASED = "released"
    #: A process that recorded no end of its own while others report that it died
    #: (or became unreachable): it will record nothing more.
    DEAD = "dead"
    # A span of a phase: finished, still open, or cut short by a failure.
    DONE = "done"
    OPEN = "open"


#: The event (and status) that ends an operation of each kind successfully.
END_EVENT: Final[dict[str, Event]] = {
    Kind.SAVE: Event.COMMITTED,
    Kind.RESTORE: Event.RESTORED,
    Kind.BARRIER: Event.COMMITTED,
}


#: The status an operation of each kind (and each of its processes) ends well with.
END_STATUS: Final[dict[str, Status]] = {
    Kind.SAVE: Status.COMMITTED,
    Kind.RESTORE: Status.RESTORED,
    Kind.BARRIER: Status.RELEASED,
}

#: Where a process's part in an operation has ended: nothing more will change it.
END_STATUSES: Final = frozenset(
    {Status.COMMITTED, Status.RESTORED, Status.RELEASED, Status.FAILED, Status.DEAD}
)


class Cause(StrEnum):
    """Why a process failed, journaled as data with its ``failed`` event.

    ``ERROR`` is a failure of the process itself (the first on record is the culprit);
    the others say it gave up because of someone else, named by ``culprit``.
    """

    ERROR = "error"
    PEER_FAILED = "peer_failed"
    PEER_DEAD = "peer_dead"
    TIMEOUT = "timeout"


#: How a save is finalized: rename a temporary directory, or write a commit file.
Mode = Literal["rename", "commit_file"]
MODES: Final[tuple[Mode, ...]] = ("rename", "commit_file")
RENAME: Final[Mode] = "rename"
COMMIT_FILE_MODE: Final[Mode] = "commit_file"

#: How a save stores its arrays: nbckpt's own layout (a zarr v2 array per leaf), or
#: Orbax's (zarr v3 arrays in an OCDBT database, as ``StandardCheckpointer`` writes).
SaveFormat = Literal["nbckpt", "orbax"]
FORMATS: Final[tuple[SaveFormat, ...]] = ("nbckpt", "orbax")
NBCKPT_FORMAT: Final[SaveFormat] = "nbckpt"
ORBAX_FORMAT: Final[SaveFormat] = "orbax"

#: Set on every engine of a cluster started with ``--dir D``: the root an
#: ``AsyncCheckpointer()`` or ``TrainingCheckpointer()`` made without one saves to.
DIR_ENV: Final = "NBCKPT_DIR"
#: The name the same root has in the engines' namespace, for ``%%px`` cells.
DIR_NAME: Final = "CKPT_DIR"
#: Set to ``0`` in a process's environment, its barriers meet at the coordination
#: service only, never at its host's hub (:mod:`nbckpt.engine.sync.hostbarrier`).
HOST_BARRIER_ENV: Final = "NBCKPT_HOST_BARRIER"

DEFAULT_SAVE_TIMEOUT_S: Final = 300.0
DEFAULT_BARRIER_TIMEOUT_S: Final = 60.0

# -- operation ids --------------------------------------------------------------------

_STAMP = "%Y%m%dT%H%M%S.%f"
_OP_RE = re.compile(r"^(?P<time>\d{8}T\d{6}(?:\.\d{6})?)-(?P<kind>[a-z]+)-(?P<rest>.+)$")


@dataclass(frozen=True)
class OpId:
    """An operation id, parsed.

    Saves and restores are ``<UTC time>-<kind>-<step>``; a journaled user barrier is
    ``<UTC time>-barrier-<key>-<name>``. Ids begin with their start time, so name
    order is time order.
    """

    op: str
    time: str
    kind: str
    step: int | None
    key: str | None = None
    name: str | None = None


def new_op_id(kind: str, step: int, now: datetime | None = None) -> str:
    """Return a fresh operation id for a save or restore of ``step``."""
    stamp = (now or datetime.now(UTC)).strftime(_STAMP)
    return f"{stamp}-{kind}-{step}"


def barrier_op_id(key: str, name: str, now: datetime | None = None) -> str:
    """Return the journal folder name of one use of a user barrier."""
    stamp = (now or datetime.now(UTC)).strftime(_STAMP)
    return f"{stamp}-{Kind.BARRIER}-{key}-{name}"


def barrier_op_glob(key: str, name: str) -> str:
    """The glob that finds :func:`barrier_op_id`'s folder before its time is known."""
    return f"*-{Kind.BARRIER}-{key}-{name}"


def parse_op_id(op: str) -> OpId | None:
    """Parse an operation id; None if ``op`` is not one nbckpt makes."""
    m = _OP_RE.match(op)
    if m is None:
        return None
    kind, rest = m["kind"], m["rest"]
    if kind == Kind.BARRIER:
        key, _, name = rest.partition("-")
        return OpId(op, m["time"], kind, None, key=key, name=name or None)
    if not rest.isascii() or not rest.isdigit():
        return None
    return OpId(op, m["time"], kind, int(rest))


#: Every key nbckpt puts in the coordination service's store starts with this.
KEY_PREFIX: Final = "nbckpt"
#: Under an operation's keys: where a process records that it failed, and where the
#: primary publishes whether it finalized (``committed`` or ``failed``).
FAILED_KEY: Final = "failed"
DECISION_KEY: Final = "decision"


def barrier_key(op: str, name: str) -> str:
    """Return the key-value prefix of barrier (or agreement) ``name`` of operation ``op``."""
    return f"{KEY_PREFIX}/{op}/{name}"


# -- checks shared by every entry point ------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def check_name(name: object, what: str = "barrier name") -> str:
    """Return ``name`` if it is safe as a key and a file name, else raise ValueError.

    ASCII letters, digits, ``_``, and ``.`` or ``-`` after the first character, at
    most 64 characters and no ``..``: no ``/``, so a name never leaves its folder.
    """
    if not isinstance(name, str) or not name.isascii() or not _NAME_RE.match(name) or ".." in name:
        raise ValueError(
            f"{what} must be 1 to 64 ASCII letters, digits, '_', '.' or '-', starting with "
            f"a letter, digit or '_', got {name!r}"
        )
    return name


def check_timeout(value: object, what: str = "timeout") -> float:
    """Return ``value`` as a float if it is a finite positive number, else raise ValueError."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a finite number of seconds above 0, got {value!r}")
    return seconds


def check_optional_timeout(value: object, what: str = "timeout_s") -> float | None:
    """Like :func:`check_timeout`, but None stays None: no limit."""
    return None if value is None else check_timeout(value, what)


def as_json() -> ProtocolNames:
    """Return the protocol's names as JSON-able data, for the lab extension and the widget."""
    return {
        "phases": list(PHASES),
        "barriers": list(Barrier),
        "barrier_prefix": BARRIER_PREFIX,
        "events": list(Event),
        "spans": list(SPANS),
        "spans_by_kind": {str(k): list(spans) for k, spans in SPANS_BY_KIND.items()},
        "end_statuses": sorted(str(s) for s in END_STATUSES),
        "statuses": {s.name.lower(): s for s in Status},
        "kinds": list(Kind),
        "kind_names": {k.name.lower(): k for k in Kind},
        "causes": list(Cause),
        "modes": list(MODES),
        "phase_names": {p.name.lower(): p for p in Phase},
        "barrier_states": {b.name.lower(): b for b in BarrierState},
    }
