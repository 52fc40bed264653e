"""Peers send files to each other, directly: the local tier's transport (issue 28).

A process whose host lost its local copies (the machine was replaced, ``/dev/shm``
wiped) fetches them from another host's local directory. Not through the shared
storage, which is what the local tier saves a trip to, and not through a device
collective, which hangs on a dead peer: over a plain TCP connection between the two
processes, where every wait has a deadline and a dead peer is an error.

Each process serves its local directory with a :class:`PeerServer`, read-only, and
asks others with :func:`list_files` and :func:`fetch`. Every connection starts with a
mutual HMAC-SHA256 challenge on a key the job's processes share, so only they may
read; what follows is neither encrypted nor signed (the files' own checksums, checked on
restore, say whether they arrived intact). The wire, after the challenge, is frames
of a 4-byte length and a JSON header, each file's bytes following its header.

This module is the one to import: the client lives in
:mod:`nbckpt.engine.tiers.peerclient` and the wire in :mod:`nbckpt.engine.tiers.peerwire`.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import stat
import threading
import time
from contextlib import suppress
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

from nbckpt.engine.tiers.peerclient import fetch, list_files
from nbckpt.engine.tiers.peerwire import (
    MAC,
    MAGIC,
    NONCE,
    PARTIAL,
    frame,
    proof,
    read_frame,
    recv_exact,
    send,
)

__all__ = ["SERVE_TIMEOUT_S", "PeerServer", "fetch", "list_files"]

#: How long a server waits on any one socket operation of a client, in seconds.
SERVE_TIMEOUT_S = 30.0


class _RefusedError(Exception):
    """A path the server does not serve."""

    def __init__(self, rel: object, why: str) -> None:
        super().__init__(f"path refused: {rel!r} ({why})")


def _inside(root: Path, rel: object) -> Path:
    """Return where ``rel`` is under ``root``, symlinks resolved; refuse leaving it."""
    if not isinstance(rel, str) or "\0" in rel:
        raise _RefusedError(rel, "not a path")
    path = PurePosixPath(rel)
    if path.is_absolute():
        raise _RefusedError(rel, "absolute")
    if ".." in path.parts:
        raise _RefusedError(rel, "it climbs out with '..'")
    full = Path(os.path.realpath(root / path))
    if full != root and root not in full.parents:
        raise _RefusedError(rel, "it leads outside the served directory")
    return full


def _listing(root: Path, folder: Path) -> list[tuple[str, int]]:
    found = []
    # Symlinks are not followed, nor listed: what is listed is what lives under root.
    for parent, _dirs, names in os.walk(folder):
        for name in names:
            if name.endswith(PARTIAL):  # a fetch into root in progress: not a file yet
                continue
            path = Path(parent, name)
            with suppress(OSError):  # removed while listed: it is not there
                st = path.lstat()
                if stat.S_ISREG(st.st_mode):
                    found.append((path.relative_to(root).as_posix(), st.st_size))
    return sorted(found)


class PeerServer:
    """Serve the files under one directory, read-only, to processes that hold the key.

    It listens on ``host`` (never on every interface unless ``host`` says so) from a
    daemon thread, and serves each connection on a daemon thread of its own, so a
    training loop in the main thread goes on. A client must first prove it holds
    ``key`` (and the server proves it too); one that does not is answered nothing.

    Parameters
    ----------
    root
        The directory served: no path that resolves outside it is served.
    key
        The secret every process of the job shares.
    host
        The address to listen on, e.g. this host's address on the job's network.
    timeout_s
        How long any one socket operation may wait on a client, so a stalled client
        cannot hold a thread forever.

    Attributes
    ----------
    address
        Where to dial, as ``host:port``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        key: bytes,
        host: str,
        *,
        timeout_s: float = SERVE_TIMEOUT_S,
    ) -> None:
        self.root = Path(os.path.realpath(root))
        self._key = key
        self._timeout_s = timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        port = self._listener.getsockname()[1]
        self.address = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        self._lock = threading.Lock()
        self._sessions: set[socket.socket] = set()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="nbckpt-peers", daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        """Stop listening and end the sessions in progress; again, it does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions)
        # On Linux, closing a socket does not wake a thread blocked in accept on it;
        # shutting it down does.
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in sessions:  # each session's thread closes its own socket
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._acceptor.join(timeout=5)

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PeerServer({str(self.root)!r} at {self.address})"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # out of descriptors, or a client gone before accept
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._sessions.add(conn)
            name = "nbckpt-peers-session"
            threading.Thread(target=self._session, args=(conn,), name=name, daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if not self._admit(conn):
                    return
                while True:
                    try:
                        request = read_frame(conn, time.monotonic() + self._timeout_s)
                    except ValueError:
                        return  # it speaks garbage
                    self._answer(conn, request)
        except (OSError, EOFError):
            return  # the client left or stalled: its session ends
        finally:
            with self._lock:
                self._sessions.discard(conn)

    def _admit(self, conn: socket.socket) -> bool:
        """Run the challenge: True when the client proved it holds the key."""
        deadline = time.monotonic() + self._timeout_s
        mine = secrets.token_bytes(NONCE)
        send(conn, MAGIC + mine, deadline)
        answer = recv_exact(conn, MAC + NONCE, deadline)
        theirs_proof, theirs = answer[:MAC], answer[MAC:]
        if not hmac.compare_digest(theirs_proof, proof(self._key, b"client", mine, theirs)):
            send(conn, b"-", deadline)
            return False
        send(conn, b"+" + proof(self._key, b"server", theirs, mine), deadline)
        return True

    def _answer(self, conn: socket.socket, request: dict[str, Any]) -> None:
        op = request.get("op")
        try:
            if op == "list":
                folder = _inside(self.root, request.get("dir"))
                files = _listing(self.root, folder)
                self._reply(conn, frame({"files": files}))
            elif op == "get" and isinstance(paths := request.get("paths"), list):
                found = [_inside(self.root, rel) for rel in paths]  # refuse before sending
                for rel, path in zip(paths, found, strict=True):
                    self._send_file(conn, rel, path)
            else:
                self._reply(conn, frame({"error": f"no such request: {op!r}"}))
        except _RefusedError as e:
            self._reply(conn, frame({"error": str(e)}))

    def _reply(self, conn: socket.socket, data: bytes) -> None:
        conn.settimeout(self._timeout_s)
        conn.sendall(data)

    def _send_file(self, conn: socket.socket, rel: str, path: Path) -> None:
        try:
            # The path is resolved; O_NOFOLLOW refuses a symlink put in its place since.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            self._reply(conn, frame({"path": rel, "missing": True}))
            return
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory is not a file it has
                self._reply(conn, frame({"path": rel, "missing": True}))
                return
            size = st.st_size
            self._reply(conn, frame({"path": rel, "size": size}))
            conn.settimeout(self._timeout_s)  # of each wait for room to send
            if size and conn.sendfile(f, 0, size) != size:
                # It shrank while sent: end the connection, the client sees it short.
                raise OSError(f"{rel} shrank while sent")
