"""The fast phase of a barrier met on the host itself, when every process shares one host.

A barrier first meets the others at the coordination service's own barrier (see
:mod:`nbckpt.engine.sync.barriers`): a round trip to process 0's service and back, over
gRPC, for every process and every barrier. When every process of the job runs on one
host (the usual notebook cluster), the processes meet there instead: each process but
one, the *hub* (the preflight's primary), keeps a Unix socket to the hub; it sends
``A <key>`` as it arrives, and the hub answers everyone ``P <key>`` (passed) once all
have, with nothing between them but the kernel.

It keeps the service barrier's promise: every participant passes or none does. Only the
hub decides, once per barrier, and tells everyone the same word: ``P``, or ``S`` (go on
to the slow phase, :mod:`nbckpt.engine.sync.storewait`, where a waiter can look for a
peer's failure and the deadline names who is missing). The hub says ``S`` when
:data:`~nbckpt.engine.sync.barriers.FAST_S` passes after it arrived without everyone,
when a process's socket closes (it died) before it arrived, and when a process says it
left (``L <key>``): a process that waited a second longer than that for the hub's word
says so, and then waits for the word all the same, since the hub may have said ``P``
before it read ``L``. A process whose hub is gone goes on to the slow phase, as does
the hub's every process at once if the hub dies. A process that gives up an operation
says so (``X <prefix>``, or the hub to itself): the hub then says ``S`` at once for
that operation's barriers, those waited at and those still to come, so the others
look for its failure a slice later instead of after the fast phase. ``S`` only sends
a barrier to the slow phase, which decides; it can never let one pass wrongly.

Which processes share a host is decided in the preflight (:mod:`nbckpt.engine.save.preflight`),
alike on every process: each posts where it runs (host name, network namespace, boot),
the primary the name of its socket, and the decision names the hub only if every
process runs where the primary does. A process joins the hub named in a decision and
keeps its link for the later barriers of every synchronizer of the process; one whose
link fails falls back to the service's barrier, which the others, waiting at the hub,
answer by going on to the slow phase after :data:`~nbckpt.engine.sync.barriers.FAST_S`.
:data:`HOST_BARRIER_ENV` set to ``0`` keeps every barrier at the service.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import selectors
import socket
import sys
import threading
import time
import uuid

from nbckpt.protocol import HOST_BARRIER_ENV

__all__ = ["HOST_BARRIER_ENV", "HostBarrier", "current", "host_key", "join", "listen"]


#: How long a process waits for the hub's word past the fast phase before it says it
#: left: the service, too, ends its barrier up to a second after the deadline.
_LEAVE_AFTER_S = 1.0
#: Decisions kept for late questions (a key is used once; a late ``L`` gets its answer).
_KEPT = 4096
#: The longest a reading thread holds the links before another thread may look.
_SLICE_S = 0.05
#: Operations given up, kept for late arrivals at their barriers (ids are never reused).
_ABANDONED_KEPT = 256


def enabled() -> bool:
    """Whether this process may meet its barriers on its host (Linux, not turned off)."""
    return sys.platform.startswith("linux") and os.environ.get(HOST_BARRIER_ENV, "1") != "0"


def host_key() -> str:
    """Where this process runs: host name, network namespace and boot, as one string.

    Two processes with the same key reach each other's abstract Unix sockets.
    """
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""  # no way to tell: never shares a host barrier
    return f"{socket.gethostname()}|{netns}|{boot}"


class _Link:
    """One Unix socket to a peer: whole lines in, whole lines out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.send_lock = threading.Lock()
        self.peer = -1  # the hub learns it from the first line
        self.closed = False

    def send(self, word: str, key: str) -> bool:
        """Send one line; False if the socket is gone."""
        data = f"{word} {key}\n".encode()
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True
                return False
        return True

    def ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for something to read (or the socket to close)."""
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        return bool(poll.poll(max(0, int(timeout_s * 1000))))

    def read(self) -> list[tuple[str, str]] | None:
        """The lines the socket holds now; None once it closed (after what it held)."""
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [tuple(line.decode().split(" ", 1)) for line in lines]  # type: ignore[misc]


class HostBarrier:
    """This process's side of the host's barriers: the hub, or a link to it.

    The hub reads its links on a thread of its own, so that a word it owes (a late
    arrival's, a goodbye's) goes out even while the process does other work.

    Parameters
    ----------
    name
        The hub's abstract socket name, as the preflight's decision gives it.
    me, count, hub
        This process, the number of processes, and the hub (all on this host).
    listener
        The hub's listening socket (the hub only).
    """

    def __init__(
        self, name: str, me: int, count: int, hub: int, listener: socket.socket | None
    ) -> None:
        self.name, self.me, self.count, self.hub = name, me, count, hub
        self._listener = listener
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._links: list[_Link] = []
        #: The hub's: who arrived at each key not decided yet, and the keys someone left.
        self._arrived: dict[str, set[int]] = {}
        self._left: set[str] = set()
        self._dead: set[int] = set()
        #: The key prefixes of operations a process gave up, oldest first.
        self._abandoned: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: Each key's word, decided by the hub (on a link: heard from it).
        self._words: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._closed = False
        if me == hub:
            threading.Thread(target=self._serve, name="nbckpt-host-barrier", daemon=True).start()
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + name)
        except OSError:
            sock.close()
            raise
        link = _Link(sock)
        link.peer = hub
        self._links.append(link)
        if not link.send("H", str(me)):
            raise ConnectionError(f"the host barrier's hub {name} closed at once")

    def wait(self, key: str, fast_s: float, deadline: float) -> bool:
        """Arrive at ``key``; True once everyone did, False to go on to the slow phase.

        ``deadline`` is the barrier's, by ``time.monotonic()``: a process still without
        the hub's word then goes on to the slow phase, which names who is missing.
        """
        if self.me == self.hub:
            return self._hub_wait(key, time.monotonic() + fast_s)
        return self._link_wait(key, time.monotonic() + fast_s + _LEAVE_AFTER_S, deadline)

    def abandon(self, prefix: str) -> None:
        """Say that this process gave up the operation whose barrier keys start ``prefix``.

        Best effort: a process whose link is gone has nobody to tell, and the others
        then go on to the slow phase after the fast one, as before.
        """
        if self.me != self.hub:
            self._links[0].send("X", prefix)
            return
        with self._changed:
            self._abandon(prefix)
            self._changed.notify_all()

    # -- the hub ----------------------------------------------------------------------

    def _abandon(self, prefix: str) -> None:
        self._abandoned[prefix] = None
        while len(self._abandoned) > _ABANDONED_KEPT:
            self._abandoned.popitem(last=False)
        for key in [k for k in self._arrived if k.startswith(prefix)]:
            self._judge(key, late=True)

    def _given_up(self, key: str) -> bool:
        return any(key.startswith(prefix) for prefix in self._abandoned)

    def _hub_wait(self, key: str, fast_end: float) -> bool:
        with self._changed:
            if key not in self._words:
                self._arrived.setdefault(key, set()).add(self.me)
            while True:
                now = time.monotonic()
                late = now >= fast_end or self._given_up(key)
                word = self._words.get(key) or self._judge(key, late)
                if word is not None:
                    return word == "P"
                self._changed.wait(fast_end - now)

    def _judge(self, key: str, late: bool) -> str | None:
        """The hub's word on ``key`` if it can be given now (and tell everyone)."""
        arrived = self._arrived.get(key, set())
        if len(arrived) == self.count and key not in self._left:
            word = "P"
        elif late or key in self._left or self._dead - arrived:
            word = "S"
        else:
            return None
        self._arrived.pop(key, None)
        self._left.discard(key)
        self._keep(key, word)
        for link in self._links:
            if link.peer >= 0 and not link.closed:
                link.send(word, key)
        return word

    def _serve(self) -> None:
        """The hub's reader: arrivals, goodbyes and closed links, as they come.

        A selector (epoll), not ``select``: a hub of hundreds of links would pass the
        1024 descriptors ``select`` can watch.
        """
        assert self._listener is not None
        watch = selectors.DefaultSelector()
        watch.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._closed:
                ready = watch.select(0.5)
                with self._changed:
                    for found, _ in ready:
                        link: _Link | None = found.data
                        if link is None:
                            self._accept(watch)
                            continue
                        lines = link.read()
                        for word, key in lines or ():
                            self._heard(link, word, key)
                        if lines is None:
                            watch.unregister(link.sock)
                            self._lost(link)
                    self._changed.notify_all()
        finally:
            watch.close()

    def _accept(self, watch: selectors.BaseSelector) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # Out of descriptors, say: that process's arrivals never come, and its
            # barriers go on to the slow phase after the fast one.
            time.sleep(0.05)
            return
        sock.setblocking(True)  # read only when the selector says so; sent whole
        link = _Link(sock)
        self._links.append(link)
        watch.register(sock, selectors.EVENT_READ, link)

    def _heard(self, link: _Link, word: str, key: str) -> None:
        if word == "H":
            link.peer = int(key)
            return
        decided = self._words.get(key)
        if decided is not None:
            link.send(decided, key)  # a late arrival, or a late goodbye
            return
        if word == "A":
            self._arrived.setdefault(key, set()).add(link.peer)
            given_up = self._given_up(key)
            if self.me in self._arrived[key] or given_up:
                # The last to arrive, or one at a barrier someone gave up: tell everyone now.
                self._judge(key, late=given_up)
        elif word == "L":
            self._left.add(key)
            self._judge(key, late=False)  # it says S now, whether or not the hub came
        elif word == "X":
            self._abandon(key)

    def _lost(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            link.sock.close()
        with contextlib.suppress(ValueError):
            self._links.remove(link)
        if link.peer >= 0:
            self._dead.add(link.peer)
            for key in list(self._arrived):
                self._judge(key, late=False)

    # -- a link to the hub ------------------------------------------------------------

    def _link_wait(self, key: str, leave_at: float, deadline: float) -> bool:
        link = self._links[0]
        if not link.send("A", key):
            return False
        said_left = False
        while True:
            with self._lock:
                word = self._words.pop(key, None)
                if word is not None:
                    return word == "P"
                if link.closed:
                    return False  # the hub is gone: everyone goes on without it
                now = time.monotonic()
                if now >= deadline:
                    return False
                if now >= leave_at and not said_left:
                    said_left = True
                    if not link.send("L", key):
                        return False
                until = deadline if said_left else leave_at
                lines = link.read() if link.ready(min(_SLICE_S, until - now)) else []
                for w, k in lines or ():
                    self._keep(k, w)  # P or S, from the hub

    def _keep(self, key: str, word: str) -> None:
        """Record ``key``'s word, forgetting the oldest past :data:`_KEPT`."""
        self._words[key] = word
        while len(self._words) > _KEPT:
            self._words.popitem(last=False)

    def close(self) -> None:
        """Close its links (the peers go on to the slow phase); the hub keeps listening."""
        self._closed = True
        for link in list(self._links):
            with contextlib.suppress(OSError):
                link.sock.close()
            link.closed = True


# -- this process's host barriers -----------------------------------------------------

_state_lock = threading.Lock()
_listener: socket.socket | None = None
_listener_name: str | None = None
#: The host barrier of each (process, process count) this OS process runs: one, but
#: a simulation (:mod:`nbckpt.sim`) runs many processes of a job in one.
_joined: dict[tuple[int, int], HostBarrier] = {}


def listen() -> str | None:
    """Open this process's hub socket (once) and return its name; None if it cannot."""
    global _listener, _listener_name
    if not enabled():
        return None
    with _state_lock:
        if _listener_name is None:
            name = f"nbckpt-barrier-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind("\0" + name)
                sock.listen(1024)
            except OSError:
                sock.close()
                return None
            sock.setblocking(False)
            _listener, _listener_name = sock, name
        return _listener_name


def join(name: str | None, me: int, count: int, hub: int) -> None:
    """Use the hub ``name`` (a preflight decision's) for process ``me``'s barriers.

    None, or a hub this process cannot reach, leaves its barriers at the service.
    """
    with _state_lock:
        joined = _joined.get((me, count))
        if joined is not None and joined.name == name:
            return
        if joined is not None:
            joined.close()
            del _joined[me, count]
        if name is None or not enabled() or count < 2:
            return
        if me == hub and name != _listener_name:
            return  # not this process's socket: it cannot be the hub
        # One that cannot reach the hub meets at the service; the others go on without it.
        with contextlib.suppress(OSError):
            _joined[me, count] = HostBarrier(name, me, count, hub, _listener if me == hub else None)


def current(me: int, count: int) -> HostBarrier | None:
    """The host barrier process ``me`` of a job of ``count`` joined, if any."""
    return _joined.get((me, count))


def _forget() -> None:
    global _listener, _listener_name, _joined, _state_lock
    _listener = _listener_name = None
    _joined = {}
    _state_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
