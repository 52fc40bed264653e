"""Peer errors: another process failed, died or timed out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nbckpt.errors._base import PeerError, who

__all__ = ["BarrierTimeoutError", "PeerDeadError", "PeerFailedError", "PeerTransferError"]


class BarrierTimeoutError(PeerError, TimeoutError):
    """Not every process reached a barrier before its deadline.

    Parameters
    ----------
    barrier
        The barrier's key, ``nbckpt/<op>/<name>``.
    missing
        The processes that had not arrived.
    timeout_s
        The deadline that passed, in seconds.
    """

    def __init__(self, barrier: str, missing: Iterable[int], timeout_s: float) -> None:
        self.barrier = barrier
        self.missing = sorted(missing)
        self.timeout_s = timeout_s
        late = f"did not arrive at barrier {barrier!r} within {timeout_s:g} s"
        super().__init__(
            f"barrier {barrier!r} timed out after {timeout_s:g} s: "
            f"{who(self.missing)} did not arrive; check that "
            f"{'it is' if len(self.missing) == 1 else 'they are'} alive and running the "
            "same operation, or raise timeout_s",
            failures=dict.fromkeys(self.missing, late),
        )


class PeerFailedError(PeerError):
    """Another process of the same operation failed, so this one gave up too.

    Parameters
    ----------
    process
        The index of the process that failed first.
    reason
        That process's own error text.
    failures
        Every process known to have failed, with its own error text; by default
        ``{process: reason}``. The message names only ``process``.
    """

    def __init__(
        self, process: int, reason: str, *, failures: Mapping[int, str] | None = None
    ) -> None:
        self.process = process
        self.reason = reason
        super().__init__(
            f"process {process} failed: {reason}", failures=failures or {process: reason}
        )


class PeerDeadError(PeerError):
    """A process of the job stopped sending heartbeats: it died, or became unreachable.

    Parameters
    ----------
    processes
        The silent processes.
    phase
        What this process was waiting on when it noticed.
    silent_s
        How long the one silent longest has been silent, in seconds.
    hosts
        Where processes run, as ``"h2 at 10.0.0.3"``, where known.
    unreachable
        The silent processes that did not die, each with what dialing it found:
        ``"unreachable"`` (its host did not answer), ``"hung"`` (it still accepts
        connections) or ``"left"`` (it lost the coordination service earlier and left
        the job). The others died: their host answered that nothing listens for them.
    service
        True when the silence is the coordination service's (process 0's), as this
        process saw it, rather than a peer's heartbeat.
    cut_off
        This process, as ``"process 2 on host h2 at 10.0.0.3"``, when no other host
        answered it either: its own link is then the likely cause.
    """

    def __init__(
        self,
        processes: Iterable[int],
        phase: str,
        silent_s: float,
        *,
        hosts: Mapping[int, str] | None = None,
        unreachable: Mapping[int, str] | None = None,
        service: bool = False,
        cut_off: str | None = None,
    ) -> None:
        self.processes = sorted(processes)
        self.phase = phase
        self.silent_s = silent_s
        self.hosts = dict(hosts or {})
        self.unreachable = dict(unreachable or {})
        self.service = service
        self.cut_off = cut_off
        # What each silent process was found to be: "died", or what dialing it found.
        found = {p: self.unreachable.get(p, "died") for p in self.processes}
        super().__init__(self._message(), failures=found)

    def _named(self, processes: list[int], verb: str) -> str:
        where = [self.hosts[p] for p in processes if p in self.hosts]
        if not where:
            return f"{who(processes)} {verb}"
        return f"{who(processes)} {verb} on host{'s' if len(where) > 1 else ''} {', '.join(where)}"

    def _message(self) -> str:
        restart = "restart the cluster, then restore the latest complete step"
        silent = f"{self.silent_s:.1f} s"
        if not (self.hosts or self.unreachable or self.service or self.cut_off):
            return (
                f"{who(self.processes)} died (no heartbeat for {silent}) during {self.phase}; "
                + restart
            )
        died = [p for p in self.processes if p not in self.unreachable]
        lost = [p for p in self.processes if p in self.unreachable]
        names = " and ".join(
            self._named(ps, verb)
            for ps, verb in ((died, "died"), (lost, "became unreachable"))
            if ps
        )
        # Each clause in the singular, then the plural.
        plural = int(len(self.processes) > 1)
        if self.service:
            runs = "ran" if died else "runs"
            evidence = f"the coordination service it {runs} has not answered for {silent}"
        else:
            evidence = f"no heartbeat for {silent}"
        kinds = set(self.unreachable.values())
        if self.cut_off:
            evidence += f", and no other host answers this one ({self.cut_off}) either"
        elif not lost and all(p in self.hosts for p in died):
            evidence += (
                ", and its host answers that it is gone",
                ", and their hosts answer that they are gone",
            )[plural]
        elif not died and kinds == {"unreachable"}:
            evidence += (", and its host does not answer", ", and their hosts do not answer")[
                plural
            ]
        elif not died and kinds == {"hung"}:
            evidence += (
                ", though it still accepts connections (it hangs, or cannot reach the "
                "coordination service)",
                ", though they still accept connections (they hang, or cannot reach the "
                "coordination service)",
            )[plural]
        elif not died and kinds == {"left"}:
            evidence = (
                "it lost the coordination service earlier and left the job",
                "they lost the coordination service earlier and left the job",
            )[plural]
        text = f"{names}: {evidence}, during {self.phase}; "
        if not lost and not self.cut_off:
            return text + restart
        if self.cut_off:
            return text + f"check this host's network link; the job cannot continue: {restart}"
        return text + f"check the network between the hosts; the job cannot continue: {restart}"


class PeerTransferError(PeerError):
    """A peer did not send what was asked of it, so nothing of it was taken.

    Raised by the local tier's transport (:mod:`nbckpt.engine.tiers.peers`) whatever
    went wrong: the connection refused, reset or timed out, the keys differ, the peer
    refused a path or lacks a file. Files already received whole stay in place; a
    partly received one is removed. Fetch the rest from another peer, or from the
    shared storage.

    Parameters
    ----------
    address
        The peer, as ``host:port``.
    request
        What was asked, in words: ``"fetch of 'step_4/a'"``, ``"list of 'step_4'"``.
    reason
        Why it failed: ``"timed out after 30 s"``, ``"authentication failed: ..."``,
        ``"peer answered missing: step_4/a"``, ``"path refused: ..."``.
    missing
        The paths the peer answered it lacks, as data; empty for other failures.
    """

    def __init__(
        self, address: str, request: str, reason: str, *, missing: Sequence[str] = ()
    ) -> None:
        self.address = address
        self.request = request
        self.reason = reason
        self.missing = list(missing)
        super().__init__(f"peer {address}: {request} failed: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its parts: a transfer fails inside an engine, and may be pickled.
        return (
            _transfer_error,
            (self.address, self.request, self.reason, self.missing),
        )


def _transfer_error(
    address: str, request: str, reason: str, missing: Sequence[str]
) -> PeerTransferError:
    return PeerTransferError(address, request, reason, missing=missing)
