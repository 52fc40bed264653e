"""Which address of this host the others reach: jax-free, for the kernel and the engines.

A cluster that spans hosts must never listen on every interface by default, nor
advertise a loopback address to other hosts. Both questions are answered here from the
kernel's routing table and the host's own name, without sending anything. So are
which port is free here (:func:`free_port`) and whether a process of this host, named in
a record, still runs (:func:`pid_alive`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

__all__ = [
    "free_port",
    "host_info",
    "is_loopback",
    "loopback_name",
    "pid_alive",
    "resolve",
    "route_address",
]


def route_address(toward: str) -> str:
    """The local address this host reaches ``toward`` (``host`` or ``host:port``) from.

    Asked of the kernel's routing table (a UDP socket connected to the address sends
    nothing), so it is the interface the other side reaches too.

    Raises
    ------
    OSError
        If ``toward`` does not resolve or no route leads there.
    """
    host, sep, port = toward.rpartition(":")
    if not sep or not port.isdigit():  # a bare host, or an IPv6 address without a port
        host, port = toward, "1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host.strip("[]"), int(port)))
        return str(s.getsockname()[0])


def is_loopback(address: str) -> bool:
    """Whether ``address`` is an IPv4 or IPv6 loopback address."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def loopback_name(coordinator: str) -> str | None:
    """This host's name if it resolves to a loopback address while the job spans hosts.

    On Debian and Ubuntu ``/etc/hosts`` maps the host name to ``127.0.1.1``. JAX's CPU
    collectives (gloo) then advertise that address to the other processes, and every
    cross-host collective fails. None when the name is fine, or the job is on one host
    (the coordinator itself is a loopback address).
    """
    host = coordinator.rpartition(":")[0].strip("[]")
    try:
        if is_loopback(socket.gethostbyname(host)):
            return None
        mine = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return socket.gethostname() if is_loopback(mine) else None


def host_info(toward: str) -> dict[str, Any]:
    """This host's name and the address it reaches ``toward`` from (run on an engine)."""
    try:
        address: str | None = route_address(toward)
    except OSError:
        address = None
    return {"host": socket.gethostname(), "address": address, "pid": os.getpid()}


def free_port(host: str) -> int:
    """A TCP port free now on ``host`` (an address of this host), as the kernel picks one.

    Raises
    ------
    OSError
        If ``host`` is not an address of this host.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve(name: str) -> str | None:
    """The IPv4 address ``name`` resolves to here, or None."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    except OSError:
        return False
    return True
