"""Answer the notebook from a thread of the engine's own, while a cell keeps it busy.

Each engine runs this small service in a thread of its own, so it answers while the
engine's main thread runs a ``%%px`` cell (a training loop). On a real cluster the
notebook's machine often does not mount the checkpoint root; the hosts do: the live
widgets, ``%ckpt_show``, ``%ckpt_timeline``, ``%ckpt_ls``, ``%ckpt_fsck`` and
``SaveHandle.wait`` read through it. On every cluster, ``%ckpt_fault`` and
``%ckpt_status`` reach a busy engine through it at once. :mod:`nbckpt.session.reads`
is the notebook's side, and :mod:`nbckpt.protocol.reads` the lists both sides agree on.

It runs only the functions in :data:`ALLOWED`, by name, and only for a client
that proves it holds the key the notebook sent through ipyparallel's authenticated
channel (``multiprocessing.connection``'s HMAC challenge, both ways). It listens on the
address that reaches the notebook's controller, never on every interface.
"""

from __future__ import annotations

import importlib
import threading
from multiprocessing.connection import Connection, Listener
from typing import Any

from nbckpt.netaddr import route_address
from nbckpt.protocol.reads import CONTROLS, READS

__all__ = ["ALLOWED", "serve", "stop"]

#: What the notebook may ask: reads of records, fsck (whose ``clean`` it asks for), and
#: the controls a busy engine must answer at once (faults, status).
ALLOWED = READS | CONTROLS

_listener: Listener | None = None
_address: str | None = None
_key: bytes | None = None


def _answer(ref: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    if ref not in ALLOWED:
        return "error", PermissionError(f"the relay does not run {ref!r}")
    module, _, name = ref.partition(":")
    try:
        return "ok", getattr(importlib.import_module(module), name)(*args, **kwargs)
    except Exception as e:  # the caller re-raises it as its own
        return "error", e


def _session(conn: Connection) -> None:
    with conn:
        while True:
            try:
                ref, args, kwargs = conn.recv()
            except (EOFError, OSError, ValueError, TypeError):
                return
            status, value = _answer(ref, args, kwargs)
            try:
                conn.send((status, value))
            except (OSError, ValueError):
                return
            except Exception as e:  # a result or error that does not pickle
                conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}")))


def _accept(listener: Listener) -> None:
    while True:
        try:
            conn = listener.accept()
        except OSError:  # closed by stop()
            return
        except Exception:  # a client without the key: refused, keep serving
            continue
        threading.Thread(target=_session, args=(conn,), name="nbckpt-relay", daemon=True).start()


def serve(authkey: bytes, toward: str) -> str:
    """Start answering reads (once per process); return ``host:port`` to dial.

    Parameters
    ----------
    authkey
        The key a client must prove it holds.
    toward
        The notebook's controller address: the service listens on this host's address
        on the route there.
    """
    global _listener, _address, _key
    if _listener is not None and _key != authkey:  # a new notebook attached: its key only
        stop()
    if _listener is None:
        host = route_address(toward)
        _listener = Listener((host, 0), authkey=authkey)
        _key = authkey
        accept = threading.Thread(target=_accept, args=(_listener,), daemon=True)
        accept.name = "nbckpt-relay"
        accept.start()
        bound = _listener.address
        _address = f"{bound[0]}:{bound[1]}"
    assert _address is not None
    return _address


def stop() -> None:
    """Stop listening (sessions in progress end with their client)."""
    global _listener, _address, _key
    if _listener is not None:
        _listener.close()
    _listener = _address = _key = None
