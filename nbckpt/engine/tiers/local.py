"""A checkpointer's local tier: this host's directory, its peers, and who holds what.

With ``local_dir`` set, every save first writes each process's shards into its host's
local directory (host memory such as ``/dev/shm``, or a local disk), and each host
then pulls the shards of ``replicas`` other hosts from them (:mod:`.peers`), so that a
lost host's shards survive on its neighbours. A restore reads the newest step the live
hosts can supply in full (:mod:`.recover`). The persistent root gets every
``persistent_every``-th step, as it would without the tier.

A host is what shares a local directory (:mod:`.hosts`). Its copies live under
``<local_dir>/nbckpt/<root key>/``, laid out like a checkpoint root whose steps hold
only some processes' shards: the shards of process ``q`` are there exactly when
``_CHECKSUMS/process_<q>.json`` is, since that file is always placed after them.

:class:`LocalTier` holds this process's side: the directory, the peer service that
serves it, and the job's hosts and peer addresses as the last preflight gathered them.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbckpt.engine.sync.barriers import SignalingClient
from nbckpt.engine.sync.health import own_address
from nbckpt.engine.tiers.hosts import host_id, replica_hosts
from nbckpt.engine.tiers.options import TierOptions, root_key
from nbckpt.engine.tiers.peers import PeerServer
from nbckpt.engine.tiers.units import held_processes
from nbckpt.formats.layout import all_steps, is_complete, read_metadata, step_dir
from nbckpt.protocol import KEY_PREFIX
from nbckpt.storage import Location

__all__ = ["LocalTier"]


@dataclass
class LocalTier:
    """This process's local tier: its directory, peer service, and the job's hosts.

    Parameters
    ----------
    options
        The tier's options; ``options.local_dir`` must be set.
    root
        The persistent root: the local copies of its steps are kept apart from others'.
    """

    options: TierOptions
    root: Location
    #: This host's id (see :func:`~nbckpt.engine.tiers.hosts.host_id`).
    host: str = field(init=False)
    #: Where this host keeps its copies of the root's steps.
    local_root: Path = field(init=False)
    #: Every process's host id and peer address, from the last preflight.
    hosts: dict[int, str] = field(default_factory=dict, init=False)
    addresses: dict[int, str] = field(default_factory=dict, init=False)
    key: bytes | None = field(default=None, init=False)
    _server: PeerServer | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        assert self.options.local_dir is not None
        folder = Path(self.options.local_dir).expanduser()
        self.host = host_id(folder)
        self.local_root = folder / "nbckpt" / root_key(self.root)
        self.local_root.mkdir(parents=True, exist_ok=True)
        _drop_stale_scratch(self.local_root)

    # -- the job's hosts ----------------------------------------------------------

    def post(self, client: SignalingClient, primary: int, timeout_s: float) -> dict[str, Any]:
        """What this process tells the others in a preflight: its host and address.

        The first call starts the peer service, with the job's key: the primary makes
        it and leaves it in the coordination service, which only the job's processes
        reach; the others wait for it there.
        """
        if self._server is None:
            self.key = _job_key(client, primary, self.root, timeout_s)
            self._server = PeerServer(self.local_root, self.key, own_address())
        return {"host": self.host, "peer": self._server.address}

    def join(self, answers: dict[int, dict[str, Any]]) -> None:
        """Take every process's host and address from a preflight's answers."""
        self.hosts = {p: str(a["host"]) for p, a in sorted(answers.items())}
        self.addresses = {p: str(a["peer"]) for p, a in sorted(answers.items())}

    def leader(self, process: int) -> int:
        """The lowest process of ``process``'s host: it writes that host's records."""
        host = self.hosts[process]
        return min(p for p, h in self.hosts.items() if h == host)

    def processes_of(self, host: str) -> list[int]:
        """The processes of ``host`` in this job."""
        return [p for p, h in self.hosts.items() if h == host]

    def origins(self, host: str) -> list[str]:
        """The hosts whose replicas ``host`` keeps."""
        ring = sorted(set(self.hosts.values()), key=lambda h: min(self.processes_of(h)))
        return [h for h in ring if h != host and host in self.replicas_of(h)]

    def replicas_of(self, host: str) -> list[str]:
        """The hosts that keep ``host``'s replicas."""
        return replica_hosts(self.hosts, host, self.options.local_replicas)

    def address_of(self, host: str) -> str:
        """The peer address that serves ``host``'s local directory."""
        return self.addresses[min(self.processes_of(host))]

    # -- what this host holds -----------------------------------------------------

    def holdings(self) -> dict[int, dict[str, Any]]:
        """Per local step committed here: its process count and the processes held."""
        found: dict[int, dict[str, Any]] = {}
        for step in all_steps(self.local_root):
            where = self.step_path(step)
            if not is_complete(where):
                continue
            meta = read_metadata(where)
            if meta is None:
                continue
            found[step] = {
                "processes": int(meta.get("process_count", 0)),
                "held": held_processes(where),
            }
        return found

    def step_path(self, step: int) -> Path:
        """This host's copy of ``step``."""
        return self.local_root / step_dir(self.local_root, step).name

    def close(self) -> None:
        """Stop serving this host's directory."""
        if self._server is not None:
            self._server.close()
            self._server = None


#: Scratch folders (:data:`SCRATCH_PREFIXES`) untouched this long belong to a process
#: that died: a tier that opens removes them.
STALE_SCRATCH_S = 3600.0
#: The names of the folders a copy from peers or a staged restore works in.
SCRATCH_PREFIXES = (".incoming-", ".restore-")


def _drop_stale_scratch(local_root: Path) -> None:
    """Remove scratch folders a dead process left; nothing else is touched."""
    now = time.time()
    for entry in local_root.iterdir():
        if not entry.name.startswith(SCRATCH_PREFIXES):
            continue
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > STALE_SCRATCH_S:
                shutil.rmtree(entry, ignore_errors=True)


def _job_key(client: SignalingClient, primary: int, root: Location, timeout_s: float) -> bytes:
    """The key every peer of this job proves it holds (the same for all its roots)."""
    name = f"{KEY_PREFIX}/tiers/peer-key"
    if client.process_index == primary:
        found = client.key_value_dir_get(f"{KEY_PREFIX}/tiers")
        text = found.get(name)
        if text is None:
            text = secrets.token_hex(32)
            client.key_value_set(name, text)
        return bytes.fromhex(text)
    text = client.blocking_key_value_get(name, timeout_s)
    if text is None:
        raise TimeoutError(
            f"process {primary} did not publish the local tier's peer key within {timeout_s:g} s"
        )
    return bytes.fromhex(text)
