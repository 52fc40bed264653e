"""The local tier's view: which host holds which step, and what a restore would read.

Every engine reports its side of a root's local tier (``set_tiers`` in
:mod:`nbckpt.engine.remote.agent`): its host, its options and what its host holds.
:func:`tiers_view` merges those answers into one :class:`~nbckpt.protocol.views.TiersView`
(a host answers once, however many of its processes report it), and :func:`tiers_text`
draws it as the table ``%ckpt_tiers`` prints. A step is recoverable when the hosts
that answered hold every process's shards between them, by the rule a restore
applies (:func:`nbckpt.engine.tiers.recover.choose`), so the table says what a restore
would do now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nbckpt.protocol import Tier
from nbckpt.protocol.views import TierChoice, TierHost, TierSettings, TierStep, TiersView

__all__ = ["tiers_text", "tiers_view"]


def _settings(answer: Mapping[str, Any]) -> TierSettings:
    options = answer["options"]
    return TierSettings(
        local_dir=answer.get("local_dir"),
        local_replicas=int(options["local_replicas"]),
        persistent_every=int(options["persistent_every"]),
        local_keep=int(options["local_keep"]),
    )


def _options(s: TierSettings) -> tuple[int, int, int]:
    """The options every process must share (each has its own directory)."""
    return (s["local_replicas"], s["persistent_every"], s["local_keep"])


def _hosts(answers: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The answers of the processes that keep a local tier, by host id."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for answer in sorted(answers, key=lambda a: int(a["process"])):
        if answer.get("host") is not None:
            found.setdefault(str(answer["host"]), []).append(answer)
    return found


def _step_row(
    step: int, held: Mapping[str, Mapping[str, Any]], persistent: set[int] | None
) -> TierStep:
    count = max((int(h["processes"]) for h in held.values()), default=0)
    holders = {host: sorted(int(p) for p in h["held"]) for host, h in held.items()}
    union = {p for units in holders.values() for p in units}
    missing = sorted(set(range(count)) - union)
    return TierStep(
        step=step,
        processes=count,
        holders=holders,
        missing=missing,
        recoverable=bool(holders) and count > 0 and not missing,
        persistent=None if persistent is None else step in persistent,
    )


def _choice(steps: Iterable[TierStep], persistent: Sequence[int] | None) -> TierChoice:
    """The step a restore of the newest one would read, as the engines choose it."""
    best = max((s["step"] for s in steps if s["recoverable"]), default=None)
    newest = max(persistent, default=None) if persistent is not None else None
    if best is not None and (newest is None or best >= newest):
        return TierChoice(step=best, tier=Tier.LOCAL)
    if newest is not None:
        return TierChoice(step=newest, tier=Tier.PERSISTENT)
    return TierChoice(step=None, tier=None)


def tiers_view(
    root: str, answers: Sequence[Mapping[str, Any]], persistent: Sequence[int] | None
) -> TiersView:
    """Merge every engine's report of ``root``'s local tier into one view.

    Parameters
    ----------
    root
        The persistent root the reports are about.
    answers
        One per live process: ``process``, ``host`` (None without a local tier),
        ``local_dir``, ``options`` and ``holdings`` (step, as a string or an int ->
        ``processes``, the count that saved it, and ``held``, the processes whose
        shards the host holds). Processes of one host report the same holdings.
    persistent
        The root's complete steps, or None when the notebook cannot tell.
    """
    if not answers:
        raise ValueError("no process reported its local tier")
    by_process = sorted(answers, key=lambda a: int(a["process"]))
    first = _settings(by_process[0])
    hosts = _hosts(by_process)
    held: dict[int, dict[str, Mapping[str, Any]]] = {}
    for host, reports in hosts.items():
        for step, holding in reports[0].get("holdings", {}).items():
            held.setdefault(int(step), {})[host] = holding
    known = None if persistent is None else {int(s) for s in persistent}
    wanted = set(held)
    if known:
        wanted.add(max(known))  # what a restore falls back to, local copy or not
    rows = [_step_row(s, held.get(s, {}), known) for s in sorted(wanted, reverse=True)]
    return TiersView(
        root=root,
        settings=first,
        disagreeing=[
            int(a["process"]) for a in by_process if _options(_settings(a)) != _options(first)
        ],
        without=[int(a["process"]) for a in by_process if a.get("host") is None],
        hosts=[
            TierHost(
                host=host,
                processes=[int(a["process"]) for a in reports],
                local_dir=reports[0].get("local_dir"),
            )
            for host, reports in hosts.items()
        ],
        steps=rows,
        persistent_steps=None if known is None else sorted(known, reverse=True),
        restore=_choice(rows, None if known is None else sorted(known)),
    )


# -- the text ``%ckpt_tiers`` prints ---------------------------------------------------


def _processes(ps: Sequence[int]) -> str:
    return ",".join(str(p) for p in ps) if ps else "none"


def _short(host: str) -> str:
    return host[:8]


def _yes(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _heading(view: TiersView) -> list[str]:
    s = view["settings"]
    if not view["hosts"]:
        return [f"{view['root']}: no local tier (every save goes to the root)"]
    replicas, every = s["local_replicas"], s["persistent_every"]
    to_root = "every save" if every == 1 else f"the steps divisible by {every}"
    lines = [
        f"{view['root']}: local tier on {len(view['hosts'])} host(s), "
        f"{replicas} replica{'s' if replicas != 1 else ''} of each, "
        f"{to_root} also to the root, the newest {s['local_keep']} kept locally"
    ]
    for h in view["hosts"]:
        lines.append(
            f"  host {_short(h['host'])}: process {_processes(h['processes'])}, {h['local_dir']}"
        )
    if view["without"]:
        lines.append(f"  no local tier on process {_processes(view['without'])}")
    if view["disagreeing"]:
        lines.append(f"  options differ from process 0's on {_processes(view['disagreeing'])}")
    return lines


def tiers_text(view: TiersView, *, listed: int = 10) -> str:
    """The plain-text table of a :class:`~nbckpt.protocol.views.TiersView`, newest first.

    ``listed`` bounds how many of the root's steps its last line names.
    """
    lines = _heading(view)
    order = {h["host"]: i for i, h in enumerate(view["hosts"])}  # by lowest process
    if view["steps"]:
        lines.append(f"{'step':>8}  {'recoverable':<11}  {'in root':<7}  held (host: processes)")
    for row in view["steps"]:
        hosts = sorted(row["holders"], key=lambda h: order.get(h, len(order)))
        held = "  ".join(f"{_short(h)}: {_processes(row['holders'][h])}" for h in hosts)
        if row["missing"]:
            held += f"  (missing {_processes(row['missing'])})"
        lines.append(
            f"{row['step']:>8}  {_yes(row['recoverable']):<11}  "
            f"{_yes(row['persistent']):<7}  {held or '-'}"
        )
    steps = view["persistent_steps"]
    if steps is not None:
        named = ", ".join(str(s) for s in steps[:listed]) or "no complete step"
        more = f" and {len(steps) - listed} older" if len(steps) > listed else ""
        lines.append(f"in the root: {named}{more}")
    lines.append(_restore_line(view))
    return "\n".join(lines)


def _restore_line(view: TiersView) -> str:
    choice = view["restore"]
    unknown = view["persistent_steps"] is None
    if choice["step"] is None:
        if unknown:
            return "no step is held whole by the live hosts; the root's steps are unknown here"
        return "a restore would find no step"
    where = "the hosts' local copies" if choice["tier"] == Tier.LOCAL else "the root"
    line = f"a restore of the latest step would read step {choice['step']} from {where}"
    return line + (
        " (unless the root holds a newer one: it cannot be listed from here)" if unknown else ""
    )
