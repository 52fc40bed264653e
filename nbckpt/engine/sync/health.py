"""Which processes are alive (heartbeats), and which of the silent ones died (dials).

Every process that checkpoints runs one heartbeat thread. Each beat bumps its own
counter ``nbckpt/health/<process>``; process 0 reads them all and reports who is
silent, and the others read its report (:mod:`nbckpt.engine.sync.beats`: a job of a
thousand processes cannot have each read every counter). A process silent for
``dead_after_s`` seconds, by process 0's clock and counted on by this one's, is taken
for dead, so clocks of different hosts never need to agree. ``jax_enable_recoverability``
must be on for survivors to outlive a dead peer; then nbckpt aborts their waits within
seconds rather than at a barrier's deadline.

A stalled process (a long hook, a slow disk) keeps beating: its thread runs on. Only a
process that is gone stops.

Died or unreachable? Each process of a multi-process job listens on a TCP port of its
own and publishes it with its host name and address (``nbckpt/hosts/<process>``; see
:mod:`nbckpt.engine.sync.hostbook` for which of those each process reads, and when).
Before blaming a silent peer, this process dials it: a refused connection means that
its host answers but the process is gone (it *died*); no answer (a timeout, no route)
means that its host cannot be reached (it *became unreachable*); a connection that
opens means that it lives but does not beat. That is most often load (a host busy
writing gigabytes can leave a beat waiting for seconds), so such a process is named
(*hung*, or cut off from the coordination service alone) only once it has been silent
for :data:`HUNG_AFTER_S`. A firewall that drops connections to that port makes a dead
process read as unreachable.

The coordination service can be lost too, when this host or process 0's is cut off.
Every call to the service then hangs, so the heartbeat thread watches its own beats:
when one has waited ``dead_after_s`` for the service, each check dials process 0: if
its host does not answer, or refuses, process 0 became unreachable (or died), and this
host is cut off if no other host answers it either; if process 0 still accepts
connections, the service is only slow, until :data:`HUNG_AFTER_S`. Process 0 runs the
service and never counts itself cut off from it. The loss is kept for good: by then the
others have taken this process for gone and abandoned what it was part of, so it cannot
rejoin the job. Once the service answers again, it publishes that it left, so that the others
fail at once rather than wait for it, and stops beating.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nbckpt.engine.sync.beats import BEAT_KEY, LEFT, beats_for
from nbckpt.engine.sync.clients import SignalingClient
from nbckpt.engine.sync.hostbook import HostBook
from nbckpt.errors import PeerDeadError
from nbckpt.netaddr import route_address

__all__ = ["DIAL_TIMEOUT_S", "HUNG_AFTER_S", "HealthMonitor", "dial", "monitor_for", "own_address"]

#: Long enough for a round trip on any network a job runs on; a refusal comes at once.
DIAL_TIMEOUT_S = 1.0
#: How long a silent process that still accepts connections (or the service of a
#: process 0 that does) is taken for slow rather than hung. Measured: 4 processes
#: saving 4 GiB on 2 loaded cores left beats waiting on the service for 5 to 7 s.
HUNG_AFTER_S = 20.0


def dial(address: str, port: int, timeout_s: float = DIAL_TIMEOUT_S) -> str:
    """Dial ``address:port`` once: ``"open"``, ``"refused"``, or ``"silent"`` (no answer)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:  # a timeout, no route to the host, the network is down
        return "silent"


def own_address() -> str:
    """The address the other hosts reach this one at: where it routes to the coordinator."""
    try:
        from jax._src.distributed import global_state

        coordinator = getattr(global_state, "coordinator_address", None)
        if coordinator:
            return route_address(str(coordinator))
    except (ImportError, OSError, ValueError):
        pass
    return "127.0.0.1"


@dataclass
class _Loss:
    """What this process learned when it lost the coordination service."""

    silent_s: float
    unreachable: dict[int, str] = field(default_factory=dict)
    cut_off: str | None = None


class HealthMonitor:
    """A heartbeat thread plus the resulting ``{process: alive | dead}`` view.

    Parameters
    ----------
    client
        The key-value client shared by the job's processes.
    interval_s
        Seconds between beats.
    dead_after_s
        Seconds without a beat after which a process counts as dead, and without an
        answer from the coordination service after which this process counts itself
        cut off from the job.
    address
        The address the other hosts reach this process at; by default the one it
        routes to the coordinator from.
    """

    def __init__(
        self,
        client: SignalingClient,
        *,
        interval_s: float = 0.5,
        dead_after_s: float = 3.0,
        address: str | None = None,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        self._beats = 0
        self._peers = beats_for(client.process_index, client.process_count, interval_s)
        self.hosts = HostBook(client.process_index, client.process_count)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: str | None = None
        self._waiting_since: float | None = None  # a beat has waited on the service since
        self._failing_since: float | None = None  # beats have failed since
        self._loss: _Loss | None = None
        self._left = False
        self._listener: socket.socket | None = None
        if client.process_count > 1:
            self._listen(address or own_address())
        self._thread = threading.Thread(target=self._run, name="nbckpt-heartbeat", daemon=True)
        self._beat()
        self._thread.start()

    # -- the heartbeat thread ---------------------------------------------------------

    def _listen(self, address: str) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            listener = socket.create_server((address, 0), family=family, backlog=1024)
        except OSError:
            return  # no dial then: a silent peer reads as dead, as before
        listener.setblocking(False)
        self._listener = listener
        self.hosts.set_own(socket.gethostname(), address, int(listener.getsockname()[1]))

    def _answer_dials(self) -> None:
        """Accept and close what dialed this process (the kernel already answered)."""
        listener = self._listener
        while listener is not None:
            try:
                conn, _ = listener.accept()
            except OSError:  # none waiting, or closed by stop()
                return
            conn.close()

    def _beat(self) -> None:
        self._answer_dials()
        self._beats += 1
        me = self.client.process_index
        started = time.monotonic()
        self._waiting_since = started
        try:
            if self._loss is not None:
                # Back in touch after a loss: say so once, then stay silent.
                self.client.key_value_set(f"{BEAT_KEY}/{me}", LEFT)
                self._left = True
                return
            self.hosts.beat(self.client)
            self.client.key_value_set(f"{BEAT_KEY}/{me}", str(self._beats))
            self._peers.read(self.client, self._beats)
        except Exception as e:  # the service itself may be gone: keep the last view
            self._error = f"{type(e).__name__}: {e}"
            if self._failing_since is None:
                self._failing_since = started
            return
        finally:
            self._waiting_since = None
        now = time.monotonic()
        down = now - (started if self._failing_since is None else self._failing_since)
        self._failing_since = None
        if down > HUNG_AFTER_S and me != 0:
            # Noticed only now that it answers again: too late to dial anyone, and long
            # enough that the others have taken this process for gone.
            self._lose(_Loss(down, {0: "unreachable"}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s) and not self._left:
            self._beat()

    def stop(self) -> None:
        """Stop beating (the others will then see this process as dead)."""
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    # -- the view and the checks ------------------------------------------------------

    def view(self) -> dict[int, str]:
        """Return ``{process: "alive" | "dead"}`` for every process of the job."""
        dead = set(self._peers.silent(self.dead_after_s))
        return {p: "dead" if p in dead else "alive" for p in range(self.client.process_count)}

    def silent_for(self, process: int) -> float:
        """Seconds ``process`` has been silent (see :mod:`nbckpt.engine.sync.beats`)."""
        return self._peers.silent_for(process)

    def service_silent_for(self) -> float:
        """Seconds the coordination service has kept this process's beats waiting or failing."""
        since = [t for t in (self._waiting_since, self._failing_since) if t is not None]
        return time.monotonic() - min(since) if since else 0.0

    def _dial(self, processes: Sequence[int]) -> dict[int, str]:
        """Dial each of ``processes`` whose port is known, all at once."""
        known = self.hosts.where(list(processes))
        if not known:
            return {}
        with ThreadPoolExecutor(max_workers=min(32, len(known))) as pool:
            found = pool.map(lambda where: dial(*where), known.values())
            return dict(zip(known, found, strict=True))

    def _cut_off(self, dials: dict[int, str]) -> str | None:
        """This process, described, if no other host it dialed answered (two at least)."""
        me = self.client.process_index
        if len(dials) < 2 or any(d != "silent" for p, d in dials.items() if p != me):
            return None
        where = self.hosts.names().get(me)
        return f"process {me}" + (f" on host {where}" if where else "")

    def _lose(self, loss: _Loss) -> None:
        with self._lock:
            if self._loss is None:
                self._loss = loss

    def check_service(self, phase: str) -> None:
        """Raise :class:`PeerDeadError` if this process lost the coordination service.

        The service runs in process 0, so the error names process 0: died if its host
        refuses the dial, otherwise unreachable. Once lost, always lost (see the
        module's docstring).
        """
        if self._loss is None:
            silent = self.service_silent_for()
            # Process 0 runs the service: a slow answer there is load, not a cut.
            if silent <= self.dead_after_s or self.client.process_index == 0:
                return
            # Dial every other process while the loss lasts: the answers say who is cut off.
            me = self.client.process_index
            dials = self._dial([p for p in range(self.client.process_count) if p != me])
            if dials.get(0) == "open" and silent <= HUNG_AFTER_S:
                return  # process 0 lives and its host answers: its service is slow
            verdict = {"refused": None, "open": "hung"}.get(dials.get(0, ""), "unreachable")
            self._lose(_Loss(silent, {} if verdict is None else {0: verdict}, self._cut_off(dials)))
        loss = self._loss
        assert loss is not None
        raise PeerDeadError(
            [0],
            phase,
            loss.silent_s,
            hosts=self.hosts.names(),
            unreachable=loss.unreachable,
            service=True,
            cut_off=loss.cut_off,
        )

    def check(self, phase: str, processes: Sequence[int] | None = None) -> None:
        """Raise :class:`PeerDeadError` if one of ``processes`` (default all) is dead.

        Or if this process lost the coordination service (:meth:`check_service`): then
        its peers only look dead.
        """
        self.check_service(phase)
        wanted = None if processes is None else set(processes)
        me = self.client.process_index
        # Only the silent ones are looked at: a check costs nothing per healthy process.
        silent = [
            p
            for p in self._peers.silent(2 * self.interval_s)
            if p != me and (wanted is None or p in wanted)
        ]
        dead = [p for p in silent if self._peers.left(p) or self.silent_for(p) > self.dead_after_s]
        if not dead:
            return
        # Peers that went silent at about the same time (a cut that took several
        # hosts) are dialed too, and named when their host does not answer either.
        near = [p for p in silent if p not in dead]
        left = [p for p in dead if self._peers.left(p)]
        # The service still answers (checked above): look up whom to dial and name.
        self.hosts.learn(self.client, dead + near)
        dials = self._dial([p for p in dead + near if p not in left])
        slow = [p for p in dead if dials.get(p) == "open" and self.silent_for(p) <= HUNG_AFTER_S]
        dead = sorted([p for p in dead if p not in slow])
        if not dead:
            return  # they live and their hosts answer: load, not a loss (yet)
        dead = sorted(dead + [p for p in near if dials.get(p) in ("silent", "refused")])
        unreachable = {
            p: "hung" if d == "open" else "unreachable"
            for p, d in dials.items()
            if p in dead and d != "refused"
        }
        unreachable.update({p: LEFT for p in left})
        raise PeerDeadError(
            dead,
            phase,
            max(self.silent_for(p) for p in dead),
            hosts=self.hosts.names(),
            unreachable=unreachable,
            cut_off=self._cut_off(dials),
        )


_monitors: dict[int, HealthMonitor] = {}
_monitors_lock = threading.Lock()


def monitor_for(client: SignalingClient) -> HealthMonitor:
    """Return the heartbeat monitor of ``client``, starting it on first use."""
    with _monitors_lock:
        mon = _monitors.get(id(client))
        if mon is None:
            mon = _monitors[id(client)] = HealthMonitor(client)
        return mon
