"""Where each process runs: a few peers learned ahead of need, the rest when needed.

Each process publishes its host name, address and dial port once under
``nbckpt/hosts/<process>``. Knowing every peer's would cost each process a read that
grows with the job, and the job a read per process: a thousand processes would move a
million records to start. A process needs a peer's record only to dial it or to name
it, which happens when something went wrong, and then the service usually still
answers: it reads those records then. Only a loss of the service itself must be judged
without it, by dialing process 0 and a few others; so process 0's record and those of
the next :data:`AHEAD` processes (in index order, wrapping) are read ahead, in the
first beats.
"""

from __future__ import annotations

import contextlib
import json
import threading

from nbckpt.engine.sync.clients import SignalingClient
from nbckpt.protocol import KEY_PREFIX

__all__ = ["AHEAD", "HOSTS_KEY", "HostBook"]

HOSTS_KEY = f"{KEY_PREFIX}/hosts"
#: How many peers' records (besides process 0's) each process reads ahead of need.
AHEAD = 8
#: Above this many unknown records, one read of them all is cheaper than one read each.
_ONE_BY_ONE = 16


class HostBook:
    """The host records this process knows: its own, those read ahead, those looked up.

    Parameters
    ----------
    process, count
        This process's index, and how many processes the job has.
    """

    def __init__(self, process: int, count: int) -> None:
        self.process = process
        self.count = count
        self._records: dict[int, tuple[str, str, int]] = {}  # process -> (name, address, port)
        self._published = False
        self._lock = threading.Lock()

    def set_own(self, name: str, address: str, port: int) -> None:
        """Record where this process listens (published at the next beat)."""
        with self._lock:
            self._records[self.process] = (name, address, port)

    def ahead(self) -> list[int]:
        """The peers whose records are read ahead: process 0 and the next :data:`AHEAD`."""
        ring = [(self.process + k) % self.count for k in range(1, min(AHEAD, self.count - 1) + 1)]
        return sorted({0, *ring} - {self.process})

    def ready(self) -> bool:
        """Whether this process's record is published and those read ahead are known."""
        with self._lock:
            return self._published and all(p in self._records for p in self.ahead())

    def beat(self, client: SignalingClient) -> None:
        """Publish this process's record once, and read ahead until those are known."""
        with self._lock:
            mine = self._records.get(self.process)
        if mine is None:
            return  # this process does not listen: nobody can dial it, and it dials nobody
        if not self._published:
            client.key_value_set(f"{HOSTS_KEY}/{self.process}", json.dumps(mine))
            self._published = True
        if not self.ready():
            self._read(client, self.ahead())

    def learn(self, client: SignalingClient, processes: list[int]) -> None:
        """Look up the records of ``processes`` not known yet (best effort)."""
        with self._lock:
            missing = [p for p in processes if p not in self._records]
        if missing:
            with contextlib.suppress(Exception):  # the service may be failing too
                self._read(client, missing)

    def _read(self, client: SignalingClient, processes: list[int]) -> None:
        if len(processes) > _ONE_BY_ONE:
            found = client.key_value_dir_get(HOSTS_KEY)
        else:
            found = {}
            for p in processes:
                value = client.key_value_try_get(f"{HOSTS_KEY}/{p}")
                if value is not None:
                    found[f"{HOSTS_KEY}/{p}"] = value
        with self._lock:
            for key, value in found.items():
                try:
                    name, address, port = json.loads(value)
                    self._records[int(key.rsplit("/", 1)[1])] = (str(name), str(address), int(port))
                except (ValueError, TypeError):
                    continue  # not nbckpt's record: that process is named without its host

    def where(self, processes: list[int]) -> dict[int, tuple[str, int]]:
        """The address and dial port of each of ``processes`` that is known."""
        with self._lock:
            return {p: self._records[p][1:] for p in processes if p in self._records}

    def names(self) -> dict[int, str]:
        """Where each known process runs, as ``"h2 at 10.0.0.3"``."""
        with self._lock:
            return {p: f"{name} at {address}" for p, (name, address, _) in self._records.items()}
