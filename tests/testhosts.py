"""Test hosts: network namespaces on this machine, each with its own address and name.

:class:`TestHosts` builds N hosts joined by a bridge, as a small private network
(``10.X.Y.0/24``, a subnet no interface or route of this machine uses): each host is a
network namespace with one interface and address, its own ``/etc/hosts`` (through
``ip netns exec``'s ``/etc/netns/<ns>/``) and, for each process started on it, its own
host name (a UTS namespace). :meth:`TestHosts.command` wraps a command so that it runs
on a host; :class:`nbckpt.procgroup.ProcessGroup` takes it as its ``launcher``.

Only the addresses of namespaces made here are ever used, and everything is removed on
:meth:`TestHosts.close` (also at interpreter exit). It needs root and ``ip`` (CI runs as
root here); :func:`unavailable` says why it cannot run elsewhere.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Host", "TestHosts", "unavailable"]

NETNS_ETC = Path("/etc/netns")


def unavailable() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces and a bridge); CI runs as root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "test hosts need iproute2's ip and util-linux's unshare"
    return None


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.0.0.0/8 that no address or route of this machine overlaps."""
    used = []
    for cmd in (["ip", "-4", "-o", "addr"], ["ip", "-4", "route"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        for word in out.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    rng = random.Random(uuid.uuid4().int)
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{rng.randint(64, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test hosts")


@dataclass(frozen=True)
class Host:
    """One test host: its namespace, host name, address and its link to the bridge."""

    index: int
    netns: str
    name: str
    address: str
    link: str  # the bridge-side end of the host's cable: down cuts the host off


class TestHosts:
    """N hosts as network namespaces joined by a bridge.

    Parameters
    ----------
    n
        How many hosts.
    loopback_names
        Map each host's own name to ``127.0.1.1`` in its ``/etc/hosts``, as Debian and
        Ubuntu do by default (the other hosts' names still map to their addresses).
    gateway
        Put this machine on the network too, at the subnet's last address
        (:attr:`gateway`), as the notebook's host: then a controller here can listen
        where the hosts reach it, and ``ssh`` from here reaches the hosts.
    shm
        Give each host its own ``/dev/shm``: a tmpfs in a mount namespace of its own,
        held (bound to a file) for the host's lifetime, so that every process started
        on the host shares it and no other host sees it. :meth:`replace` loses it.

    Examples
    --------
    >>> with TestHosts(3) as hosts:                           # doctest: +SKIP
    ...     subprocess.run(hosts.command(1, ["hostname"]))    # prints host name "h1"
    """

    __test__ = False  # a fixture, not a test class

    def __init__(
        self, n: int, *, loopback_names: bool = False, gateway: bool = False, shm: bool = False
    ) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        tag = uuid.uuid4().hex[:6]
        self.bridge = f"nbbr{tag}"
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.gateway: str | None = str(addresses[-1]) if gateway else None
        self.hosts = [
            Host(i, f"nbh{tag}{i}", f"h{i}", str(addresses[i]), f"nv{tag}{i}o") for i in range(n)
        ]
        self._made: list[str] = []
        #: Per host, the file its mount namespace (its own /dev/shm) is held by.
        self.mounts: dict[int, Path] = {}
        atexit.register(self.close)
        try:
            self._build(tag, loopback_names)
            if shm:
                self._held = Path(f"/run/nbckpt-hosts-{tag}")
                self._held.mkdir()
                self._made.append(f"held:{self._held}")
                # A file can hold a mount namespace only on a private mount.
                subprocess.run(["mount", "--bind", str(self._held), str(self._held)], check=True)
                subprocess.run(["mount", "--make-private", str(self._held)], check=True)
                for h in self.hosts:
                    self._new_shm(h.index)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str, loopback_names: bool) -> None:
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        self._made.append(f"link:{self.bridge}")
        _ip("link", "set", self.bridge, "up")
        if self.gateway is not None:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        names = "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for h in self.hosts:
            _ip("netns", "add", h.netns)
            self._made.append(f"netns:{h.netns}")
            outside, inside = h.link, f"nv{tag}{h.index}i"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", h.netns)
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/{self.subnet.prefixlen}", "dev", inside)
            _ip("-n", h.netns, "link", "set", inside, "up")
            _ip("-n", h.netns, "link", "set", "lo", "up")
            etc = NETNS_ETC / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            self._made.append(f"etc:{etc}")
            own = f"127.0.1.1 {h.name}\n" if loopback_names else ""
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{own}{names}")

    def _new_shm(self, index: int) -> None:
        held = self._held / f"mnt{index}-{uuid.uuid4().hex[:6]}"
        held.touch()
        subprocess.run(
            ["unshare", f"--mount={held}", "--propagation", "private",
             "mount", "-t", "tmpfs", "-o", "size=2g,mode=1777", "tmpfs", "/dev/shm"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.mounts[index] = held

    def _drop_shm(self, index: int) -> None:
        held = self.mounts.pop(index, None)
        if held is not None:
            # The tmpfs goes once no process of the host holds the namespace either.
            subprocess.run(["umount", "-l", str(held)], capture_output=True)
            held.unlink(missing_ok=True)

    def replace(self, index: int) -> None:
        """Replace host ``index`` by a new machine: same name and address, empty ``/dev/shm``.

        Its processes must have ended (a lost host's processes are gone with it).
        """
        self._drop_shm(index)
        self._new_shm(index)

    def __len__(self) -> int:
        return len(self.hosts)

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as it runs on host ``index``: its network, ``/etc/hosts`` and name."""
        h = self.hosts[index]
        held = self.mounts.get(index)
        enter = [] if held is None else ["nsenter", f"--mount={held}"]
        return [
            *enter,
            "ip", "netns", "exec", h.netns,
            "unshare", "--uts",
            "sh", "-c", 'hostname "$0" && exec "$@"', h.name,
            *argv,
        ]  # fmt: skip

    def launcher(self, placement: Sequence[int]) -> list[list[str]]:
        """Per process, the prefix that starts it on host ``placement[i]``."""
        return [self.command(h, []) for h in placement]

    def kill(self, index: int) -> None:
        """SIGKILL every process on host ``index``: the host is lost, daemons and all."""
        netns = self.hosts[index].netns
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def cut(self, index: int) -> None:
        """Cut host ``index`` off the network, as a pulled cable: its processes live on."""
        _ip("link", "set", self.hosts[index].link, "down")

    def reconnect(self, index: int) -> None:
        """Plug host ``index`` back in (after :meth:`cut`)."""
        _ip("link", "set", self.hosts[index].link, "up")

    def close(self) -> None:
        """Remove every namespace, link and file this made (again: nothing to do)."""
        for index in list(self.mounts):
            self._drop_shm(index)
        for item in reversed(self._made):
            kind, _, name = item.partition(":")
            if kind == "held":
                subprocess.run(["umount", "-l", name], capture_output=True)
                shutil.rmtree(name, ignore_errors=True)
            elif kind == "netns":
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            elif kind == "link":
                subprocess.run(["ip", "link", "del", name], capture_output=True)
            elif kind == "etc":
                shutil.rmtree(name, ignore_errors=True)
        self._made.clear()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
