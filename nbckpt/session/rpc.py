"""Calling engines by name, and turning their errors into one that names processes.

The notebook never imports jax, nor any of ``nbckpt.engine``: engine functions are sent
by name (:func:`remote`) and imported on the engines, as :mod:`nbckpt.procgroup` does
for its workers. ipyparallel pickles :func:`call` by reference to this module, so the
engines import it too: it needs neither jax nor IPython, and imports ipyparallel only
inside the functions that run in the kernel.
"""

from __future__ import annotations

import functools
import importlib
import uuid
from collections.abc import Callable
from typing import Any

from nbckpt.errors import ClusterError

__all__ = [
    "AGENT",
    "ENGINE_DIED",
    "HOST_INFO",
    "PROCESS",
    "RELAY",
    "ask",
    "call",
    "call_key",
    "collect",
    "engine_errors",
    "errors_by_process",
    "last_line",
    "remote",
    "send",
]

#: The engine-side modules the notebook calls into, by name only.
AGENT = "nbckpt.engine.remote.agent"
PROCESS = "nbckpt.engine.sync.process"
RELAY = "nbckpt.engine.remote.relay"
HOST_INFO = "nbckpt.netaddr:host_info"

#: How an engine's death reads in an error.
ENGINE_DIED = "EngineError: the engine died (its process exited)"

#: One engine's outcome: ``(True, result)`` or ``(False, one line of error)``.
Outcome = tuple[bool, Any]


def call_key() -> str:
    """A fresh id for one collective call, sent to every engine.

    Engines match the parts of one call by this id rather than by counting calls,
    so a call that failed on only some engines cannot put them out of step.
    """
    return uuid.uuid4().hex[:16]


def call(ref: str, *args: Any, **kwargs: Any) -> Any:
    """Import ``module:function`` here and call it; meant to run on an engine.

    Parameters
    ----------
    ref
        ``"package.module:function"``, importable where this runs.
    """
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def remote(ref: str) -> Callable[..., Any]:
    """Return a callable to send to engines that runs ``module:function`` there.

    Sending the function object itself would import its module, and with it jax and
    tensorstore, into the notebook's kernel; this sends only its name. ipyparallel
    pickles :func:`call` by reference to this module, which needs no jax.
    """
    return functools.partial(call, ref)


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (of a traceback: the error itself)."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(text)


def error_text(exc: BaseException) -> str:
    """One line for one engine's error (a RemoteError, or an EngineError on death)."""
    ename = getattr(exc, "ename", None)
    text = (
        f"{ename}: {last_line(getattr(exc, 'evalue', ''))}"
        if ename
        else (f"{type(exc).__name__}: {last_line(str(exc))}")
    )
    return ENGINE_DIED if "died while running" in text or ename == "EngineError" else text


def send(
    client: Any, ids: list[int], fn: str | Callable[..., Any], *args: Any, **kwargs: Any
) -> list[Any]:
    """Send ``fn`` to the engines ``ids`` of ``client`` without waiting; their AsyncResults.

    ``fn`` is a function, or ``"module:function"`` to import on the engines.
    """
    if isinstance(fn, str):
        fn = remote(fn)
    return [client[eid].apply_async(fn, *args, **kwargs) for eid in ids]


def collect(pending: list[Any], timeout_s: float | None) -> list[Outcome]:
    """Wait for AsyncResults; per engine, ``(True, result)`` or ``(False, text)``."""
    import ipyparallel as ipp

    out: list[Outcome] = []
    for ar in pending:
        try:
            out.append((True, ar.get(timeout=timeout_s)))
        except (ipp.error.RemoteError, ipp.error.EngineError) as e:
            out.append((False, error_text(e)))
        except ipp.error.TimeoutError:
            out.append((False, f"no answer within {timeout_s:g} s"))
    return out


def ask(
    client: Any,
    ids: list[int],
    fn: str | Callable[..., Any],
    *args: Any,
    timeout_s: float | None,
    **kwargs: Any,
) -> list[Outcome]:
    """Run ``fn`` on the engines ``ids`` at once; per engine, as :func:`collect`."""
    return collect(send(client, ids, fn, *args, **kwargs), timeout_s)


def failures(outcomes: list[Outcome]) -> dict[int, str]:
    """The failed outcomes of a list in rank order: process -> its error's line."""
    return {rank: res for rank, (ok, res) in enumerate(outcomes) if not ok}


def errors_by_process(what: str, errors: dict[int, str]) -> ClusterError:
    """One :class:`ClusterError` for per-process error texts, grouping equal texts.

    ``-1`` stands for an engine that could not be matched to a process.
    """
    return ClusterError.from_failures(what, errors)


def engine_errors(exc: BaseException, ranks: dict[int, int], what: str) -> ClusterError:
    """Turn an ipyparallel error into one :class:`ClusterError` that names processes.

    Parameters
    ----------
    exc
        A ``CompositeError``, ``RemoteError`` or ``EngineError`` from ipyparallel.
    ranks
        Engine id -> JAX process index.
    what
        What was being done, for the message (``"save"``, ``"barrier"``, ...).
    """
    import ipyparallel as ipp

    if isinstance(exc, ipp.error.CompositeError):
        items = [(e[3].get("engine_id"), f"{e[0]}: {last_line(e[1])}") for e in exc.elist]
        items = [(eid, ENGINE_DIED if "died while running" in t else t) for eid, t in items]
    else:
        eid = (getattr(exc, "engine_info", None) or {}).get("engine_id")
        items = [(eid, error_text(exc))]
    errors: dict[int, str] = {}
    for n, (eid, text) in enumerate(items):
        rank = ranks.get(eid, -1) if eid is not None else -1
        errors[rank if rank >= 0 else -1 - n] = text
    return errors_by_process(what, errors)
