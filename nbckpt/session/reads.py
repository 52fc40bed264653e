"""Where the notebook reads checkpoint records: here, or on the hosts that see them.

Every read the notebook makes of a checkpoint root (journals for the widgets and
``SaveHandle``, ``%ckpt_ls``, ``%ckpt_fsck``, ``%ckpt_timeline``) goes through a
:class:`Reader`, by the read function's name. With a cluster on this machine (and
without one) it is :data:`LOCAL`, which simply calls the function. With a cluster on
other hosts, whose storage this machine may not mount,
:class:`~nbckpt.session.cluster.JaxCluster` starts a read service on every engine
(:mod:`nbckpt.engine.remote.relay`), and its reader (``cluster.reader``, which the
client, its handles, the widgets and the magics use) sends the reads there: to process
0's host, or the next process if that one does not answer. Nothing is routed by a
module global: a read goes where the reader it is given sends it.

Nothing here imports jax.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from nbckpt.errors import ClusterError
from nbckpt.protocol.reads import (
    ALL_STEPS,
    FSCK,
    IS_COMPLETE,
    LIST_OPERATIONS,
    LIST_STEPS,
    READ_MATCHING,
    READ_METADATA,
    READ_OPERATION,
    READS,
)

__all__ = [
    "ALL_STEPS",
    "IS_COMPLETE",
    "LIST_OPERATIONS",
    "LIST_STEPS",
    "READS",
    "READ_MATCHING",
    "READ_METADATA",
    "READ_OPERATION",
    "FSCK",
    "LOCAL",
    "Reader",
    "Relay",
]


class Relay:
    """A connection to the engines' read services, tried in process order.

    Parameters
    ----------
    addresses
        ``host:port`` of each process's service, in process order.
    authkey
        The key the services were started with.
    hosts
        The host name of each process, for messages.
    timeout_s
        How long one read may take before the next process is asked.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        authkey: bytes,
        hosts: Sequence[str] = (),
        timeout_s: float = 30.0,
    ) -> None:
        self.addresses = list(addresses)
        self.hosts = list(hosts) or [a.rpartition(":")[0] for a in addresses]
        self._key = authkey
        self.timeout_s = timeout_s
        self._conn: Connection | None = None
        self._at = 0
        self._lock = threading.Lock()

    def _connect(self, address: str) -> Connection:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=min(self.timeout_s, 5.0))
        # Connection reads the raw descriptor, which must block; waits are bounded by
        # poll() in call() instead.
        sock.setblocking(True)
        conn = Connection(sock.detach())
        try:
            answer_challenge(conn, self._key)
            deliver_challenge(conn, self._key)
        except BaseException:
            conn.close()
            raise
        return conn

    def call(self, ref: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``module:function`` on the first process that answers; return its result.

        Raises
        ------
        ClusterError
            If no process answers (the message names the hosts tried).
        Exception
            What the function raised there, as it raised it.
        """
        with self._lock:
            tried = []
            count = len(self.addresses)
            for k in range(count):
                i = (self._at + k) % count
                try:
                    if self._conn is None:
                        self._conn = self._connect(self.addresses[i])
                        self._at = i  # keep asking the one that answers
                    self._conn.send((ref, args, kwargs))
                    if not self._conn.poll(self.timeout_s):
                        raise TimeoutError(f"no answer within {self.timeout_s:g} s")
                    status, value = self._conn.recv()
                except (OSError, EOFError) as e:
                    self.close_connection()
                    tried.append(f"process {i} on {self.hosts[i]}: {e or type(e).__name__}")
                    continue
                if status == "ok":
                    return value
                raise value
            raise ClusterError(
                "no host answered the read of checkpoint records (" + "; ".join(tried) + "); "
                "the hosts see the storage, this machine may not: check the cluster with "
                "%ckpt_cluster status"
            )

    def ask(self, process: int, ref: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``module:function`` on process ``process``'s service; return its result.

        For what must reach that very process (a fault), even while a cell keeps its
        engine busy; a connection of its own, closed after the answer.

        Raises
        ------
        EOFError
            If the process ended before it answered (a fault that kills it at once).
        TimeoutError
            If it did not answer within ``timeout_s``.
        OSError
            If its service could not be reached.
        Exception
            What the function raised there, as it raised it.
        """
        conn = self._connect(self.addresses[process])
        with conn:
            conn.send((ref, args, kwargs))
            if not conn.poll(self.timeout_s):
                raise TimeoutError(
                    f"process {process} on {self.hosts[process]} did not answer within "
                    f"{self.timeout_s:g} s"
                )
            status, value = conn.recv()
        if status == "ok":
            return value
        raise value

    def close_connection(self) -> None:
        """Drop the connection; the next call connects again."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None


def _call_here(ref: str, *args: Any, **kwargs: Any) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


class Reader:
    """Runs the notebook's reads of checkpoint records: here, or through a relay.

    A cluster owns its reader (:attr:`JaxCluster.reader`), so reads follow the cluster
    they are made for rather than whichever cluster was started last.

    Parameters
    ----------
    relay
        The engines' read services to send reads to; None (the default) reads here.
    """

    def __init__(self, relay: Relay | None = None) -> None:
        self._relay = relay

    @property
    def remote(self) -> bool:
        """Whether reads go to the hosts rather than this machine."""
        return self._relay is not None

    @property
    def relay(self) -> Relay | None:
        """The relay reads go through, or None when they run here."""
        return self._relay

    def run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the read function ``name`` (``module:function``) where the storage is seen."""
        if self._relay is not None:
            return self._relay.call(name, *args, **kwargs)
        return _call_here(name, *args, **kwargs)

    def __repr__(self) -> str:
        if self._relay is None:
            return "Reader(local)"
        return f"Reader(relay to {', '.join(self._relay.hosts)})"


LOCAL = Reader()
"""The reader that runs every read on this machine."""
