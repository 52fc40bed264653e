"""The peers' wire: frames with a deadline, and the challenge that opens each connection.

Shared by :mod:`nbckpt.engine.tiers.peers` (the server) and
:mod:`nbckpt.engine.tiers.peerclient`. After the challenge, everything is a frame: a
4-byte length and a JSON header, and a file's bytes follow its header. Every wait is
bounded by a deadline (``time.monotonic()``), so nothing blocks past it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from typing import Any

__all__ = [
    "MAC",
    "MAGIC",
    "MAX_FRAME",
    "NONCE",
    "PARTIAL",
    "frame",
    "proof",
    "read_frame",
    "recv_exact",
    "recv_into",
    "send",
]

#: The server's greeting: says what speaks, and which version of the wire.
MAGIC = b"NBPEERS1"
#: The bytes of each side's challenge, and of each proof.
NONCE = 32
MAC = hashlib.sha256().digest_size
#: The most a header may take; a list of many files is the largest.
MAX_FRAME = 64 << 20
#: How the name of a file still being received ends (``.<name>.<random>.nbckpt-part``).
PARTIAL = ".nbckpt-part"


def proof(key: bytes, side: bytes, *nonces: bytes) -> bytes:
    """Return one side's answer to the challenge: HMAC-SHA256 of its name and nonces.

    The side's name (``b"client"``, ``b"server"``) is in the proof, so a proof
    cannot be sent back as the other side's.
    """
    return hmac.new(key, side + b"".join(nonces), hashlib.sha256).digest()


def recv_into(sock: socket.socket, view: memoryview, deadline: float) -> int:
    """Receive what has arrived into ``view``, at least one byte; return how many.

    Raises
    ------
    TimeoutError
        Nothing arrived before ``deadline``.
    EOFError
        The other side closed the connection.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
    got = sock.recv_into(view)
    if not got:
        raise EOFError
    return got


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Receive exactly ``n`` bytes by ``deadline`` (raising as :func:`recv_into`)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        got += recv_into(sock, view[got:], deadline)
    return bytes(buf)


def send(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send all of ``data`` by ``deadline``, or raise :class:`TimeoutError`."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)  # since Python 3.5, the limit of the whole sendall
    sock.sendall(data)


def frame(header: dict[str, Any]) -> bytes:
    """Return ``header`` as a frame: its length in 4 bytes, then its JSON."""
    body = json.dumps(header, separators=(",", ":")).encode()
    return len(body).to_bytes(4, "big") + body


def read_frame(sock: socket.socket, deadline: float) -> dict[str, Any]:
    """Receive one frame's header by ``deadline``.

    Raises
    ------
    ValueError
        What arrived is not a frame: too long, not JSON, or not a JSON object.
    """
    size = int.from_bytes(recv_exact(sock, 4, deadline), "big")
    if size > MAX_FRAME:
        raise ValueError(f"a header of {size} bytes")
    header = json.loads(recv_exact(sock, size, deadline))
    if not isinstance(header, dict):
        raise ValueError("a header that is not an object")
    return header
