"""Ask a peer for files: :func:`list_files` and :func:`fetch`, each within a deadline.

The client side of :mod:`nbckpt.engine.tiers.peers`, which serves the files. Every
failure, a dead peer included, is one :class:`~nbckpt.errors.PeerTransferError`
naming the peer, what was asked and why; no call waits past its deadline.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Any

from nbckpt.engine.tiers.peerwire import (
    MAC,
    MAGIC,
    NONCE,
    PARTIAL,
    frame,
    proof,
    read_frame,
    recv_exact,
    recv_into,
    send,
)
from nbckpt.errors import PeerTransferError

__all__ = ["fetch", "list_files"]

# Receive buffer, and how much arrives between two progress calls.
_CHUNK = 1 << 20
_PROGRESS_EVERY = 4 << 20


class _BrokenError(Exception):
    """The exchange failed for the reason given; the public functions say with whom."""


class _Dial:
    """One authenticated connection to a peer, every wait bounded by one deadline."""

    def __init__(self, address: str, key: bytes, deadline: float) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise _BrokenError(f"{address!r} is not a host:port address")
        self.deadline = deadline
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=left)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._prove(key)
        except BaseException:
            self.sock.close()
            raise

    def _prove(self, key: bytes) -> None:
        greeting = self.recv(len(MAGIC) + NONCE)
        if not greeting.startswith(MAGIC):
            raise _BrokenError("it does not speak nbckpt's peer protocol")
        theirs, mine = greeting[len(MAGIC) :], secrets.token_bytes(NONCE)
        self.send(proof(key, b"client", theirs, mine) + mine)
        if self.recv(1) != b"+":
            raise _BrokenError("authentication failed: the peer refused this process's key")
        if not hmac.compare_digest(self.recv(MAC), proof(key, b"server", mine, theirs)):
            raise _BrokenError("authentication failed: the peer could not prove it holds the key")

    def send(self, data: bytes) -> None:
        send(self.sock, data, self.deadline)

    def recv(self, n: int) -> bytes:
        return recv_exact(self.sock, n, self.deadline)

    def recv_into(self, view: memoryview) -> int:
        return recv_into(self.sock, view, self.deadline)

    def ask(self, request: dict[str, Any]) -> None:
        self.send(frame(request))

    def answer(self) -> dict[str, Any]:
        try:
            header = read_frame(self.sock, self.deadline)
        except ValueError as e:
            raise _BrokenError(f"its answer is not the protocol's ({e})") from None
        if "error" in header:
            raise _BrokenError(str(header["error"]))
        return header

    def close(self) -> None:
        self.sock.close()


@contextmanager
def _transfer(address: str, request: str, deadline_s: float) -> Iterator[None]:
    """Turn every failure of the block into one :class:`PeerTransferError`."""

    def error(reason: str) -> PeerTransferError:
        return PeerTransferError(address, request, reason)

    try:
        yield
    except PeerTransferError:
        raise
    except _BrokenError as e:
        raise error(str(e)) from None
    except TimeoutError:
        raise error(f"timed out after {deadline_s:g} s") from None
    except ConnectionRefusedError:
        raise error("connection refused (nothing listens there: is the peer gone?)") from None
    except EOFError:
        raise error("the peer closed the connection (it died, or stopped serving)") from None
    except ConnectionResetError:
        raise error("the peer reset the connection (it died, or stopped serving)") from None
    except OSError as e:
        raise error(f"{type(e).__name__}: {e.strerror or e}") from None


def _named(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:3])
    return shown if len(paths) == 1 else f"{len(paths)} files ({shown}{', ...' * (len(paths) > 3)})"


def list_files(
    address: str, key: bytes, reldir: str, *, deadline_s: float
) -> list[tuple[str, int]]:
    """Return every regular file under a peer's ``reldir``, with its size, sorted.

    Paths are relative to the directory the peer serves (not to ``reldir``), with
    ``/`` between parts; a directory the peer lacks has no files.

    Parameters
    ----------
    address
        The peer's :attr:`PeerServer.address`.
    key
        The key the peer's server holds.
    reldir
        The directory to list, relative to the one served (``""`` for all of it).
    deadline_s
        How long the whole call may take, connecting included.

    Raises
    ------
    PeerTransferError
        The peer could not be reached, refused the key or the path, or did not answer
        by the deadline.
    """
    deadline = time.monotonic() + deadline_s
    with _transfer(address, f"list of {reldir!r}", deadline_s):
        dial = _Dial(address, key, deadline)
        try:
            dial.ask({"op": "list", "dir": reldir})
            files = dial.answer().get("files")
        finally:
            dial.close()
        if not isinstance(files, list) or not all(_is_entry(f) for f in files):
            raise _BrokenError("its answer is not a list of files")
        return [(rel, size) for rel, size in files]


def _is_entry(entry: object) -> bool:
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    return isinstance(entry[0], str) and isinstance(entry[1], int)


def fetch(
    address: str,
    key: bytes,
    relpaths: Sequence[str],
    dest: str | os.PathLike[str],
    *,
    deadline_s: float,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy files from a peer into ``dest``, each in place whole and durably, or not at all.

    Each file lands at ``dest/relpath`` (parents created): written under a temporary
    name beside it, flushed to disk, renamed into place, and its directory flushed, so
    a reader sees the old file or the whole new one, even after a crash. Several
    fetches may write the same files at once.

    Parameters
    ----------
    address
        The peer's :attr:`PeerServer.address`.
    key
        The key the peer's server holds.
    relpaths
        The files to copy, relative to the directory the peer serves.
    dest
        The directory to copy into.
    deadline_s
        How long the whole call may take, connecting included.
    progress
        Called with the bytes received so far as they arrive (every few MiB).

    Returns
    -------
    int
        The bytes of file data received.

    Raises
    ------
    PeerTransferError
        The peer could not be reached, refused the key or a path, lacked a file
        (``missing`` names them: the other files are copied), died, or did not send
        everything by the deadline. A file received in part is removed; files received
        whole before the failure stay.
    """
    deadline = time.monotonic() + deadline_s
    paths = list(relpaths)
    out = _Receiver(Path(dest), progress)
    with _transfer(address, f"fetch of {_named(paths)}", deadline_s):
        if not paths:
            return 0
        dial = _Dial(address, key, deadline)
        try:
            dial.ask({"op": "get", "paths": paths})
            for rel in paths:
                header = dial.answer()
                if header.get("path") != rel:
                    raise _BrokenError(f"it answered {header.get('path')!r} when {rel!r} was due")
                if header.get("missing"):
                    out.missing.append(rel)
                    continue
                size = header.get("size")
                if not isinstance(size, int) or size < 0:
                    raise _BrokenError(f"it gave no size for {rel!r}")
                out.receive(dial, rel, size)
        finally:
            dial.close()
        out.flush_folders()
        if out.missing:
            missing = ", ".join(out.missing)
            raise PeerTransferError(
                address,
                f"fetch of {_named(paths)}",
                f"peer answered missing: {missing}",
                missing=out.missing,
            )
    return out.total


class _Receiver:
    """Where a fetch writes: whole files into ``dest``, and the folders to flush."""

    def __init__(self, dest: Path, progress: Callable[[int], None] | None) -> None:
        self.dest = dest
        self.progress = progress
        self.total = 0
        self.reported = 0
        self.missing: list[str] = []
        self.changed: set[Path] = set()
        self.view = memoryview(bytearray(_CHUNK))  # one buffer for every file

    def receive(self, dial: _Dial, rel: str, size: int) -> None:
        with _local(self.dest):
            folder, name = self._folder(rel)
            temp = folder / f".{name}.{uuid.uuid4().hex}{PARTIAL}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                self._copy(dial, fd, size)
                with _local(temp):
                    os.fsync(fd)
            finally:
                os.close(fd)
            with _local(temp):
                os.replace(temp, folder / name)
        except BaseException:
            with suppress(OSError):
                temp.unlink()
            raise
        self.changed.add(folder)

    def _folder(self, rel: str) -> tuple[Path, str]:
        """Make the folders ``rel`` needs under ``dest``; refuse one outside it."""
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise _BrokenError(f"path refused: {rel!r} (it leads outside {self.dest})")
        folder = self.dest
        if not folder.is_dir():
            made = [p for p in (folder, *folder.parents) if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            self.changed.update(p.parent for p in made)
        for part in path.parts[:-1]:
            with suppress(FileExistsError):  # made by another fetch, or before
                (folder / part).mkdir()
                self.changed.add(folder)
            folder = folder / part
        return folder, path.name

    def _copy(self, dial: _Dial, fd: int, size: int) -> None:
        left = size
        while left:
            got = dial.recv_into(self.view[: min(left, _CHUNK)])
            chunk = self.view[:got]
            with _local(self.dest):
                while chunk:  # os.write may write less than it is given
                    chunk = chunk[os.write(fd, chunk) :]
            left -= got
            self.total += got
            if self.progress and self.total - self.reported >= _PROGRESS_EVERY:
                self.reported = self.total
                self.progress(self.total)

    def flush_folders(self) -> None:
        """Flush the folders that gained entries, so the renames survive a crash."""
        if self.progress and self.total != self.reported:
            self.reported = self.total
            self.progress(self.total)
        for folder in sorted(self.changed):
            with _local(folder):
                fd = os.open(folder, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


@contextmanager
def _local(where: Path) -> Iterator[None]:
    """Say that a failure to write here is this host's, not the peer's."""
    try:
        yield
    except OSError as e:
        raise _BrokenError(f"cannot write under {where}: {e.strerror or e}") from None
