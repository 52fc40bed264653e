"""How nbckpt's errors show in IPython: one line, as a UsageError does, not a traceback.

An error raised on the engines reaches the notebook through the magics, the client
and the cluster; its traceback runs through all three, and only its last line helps.
:func:`install` registers :func:`show_error` with IPython's ``set_custom_exc`` for
:class:`~nbckpt.errors.NbckptError` (and for ipyparallel's ``RemoteError``, which
wraps the errors nbckpt's engine code raises inside ``%px``). The handler prints the
message alone to stderr and stores the exception where ``%tb`` finds it
(``sys.last_value``, as IPython does for every error it shows), so the whole traceback
is one command away. The exception itself keeps its data (``processes``, ``causes``).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from nbckpt.errors import NbckptError

__all__ = ["ENGINE_ERROR_NAMES", "compact_text", "install", "show_error"]

#: The names of nbckpt's error classes, as an engine's ``RemoteError`` reports them.
ENGINE_ERROR_NAMES = frozenset(
    name
    for name, obj in vars(sys.modules[NbckptError.__module__]).items()
    if isinstance(obj, type) and issubclass(obj, NbckptError)
)


def _remote_errors() -> tuple[type[BaseException], ...]:
    """The error ipyparallel raises for a failure on engines, if it is imported."""
    ipp_error = sys.modules.get("ipyparallel.error")
    return () if ipp_error is None else (ipp_error.RemoteError,)


def _engine_parts(value: BaseException) -> list[tuple[str, str, Any]] | None:
    """``(ename, evalue, engine_info)`` per engine of a RemoteError, when all are nbckpt's."""
    elist = getattr(value, "elist", None)
    if elist is not None:  # a CompositeError: one entry per engine
        parts = [(str(e[0]), str(e[1]), e[3] if len(e) > 3 else {}) for e in elist]
    else:
        ename = getattr(value, "ename", None)
        if ename is None:
            return None
        parts = [(str(ename), str(getattr(value, "evalue", "")), getattr(value, "engine_info", {}))]
    if not parts or any(name not in ENGINE_ERROR_NAMES for name, _t, _i in parts):
        return None
    return parts


def compact_text(value: BaseException) -> str | None:
    """The lines to show for ``value`` in place of its traceback, or None to show it all.

    An nbckpt error shows as ``Name: message``. An ipyparallel error whose every engine
    raised an nbckpt error shows one line per distinct message, each naming its
    engines; any other error keeps IPython's usual traceback.
    """
    if isinstance(value, NbckptError):
        return f"{type(value).__name__}: {value}"
    parts = _engine_parts(value)
    if parts is None:
        return None
    grouped: dict[str, list[str]] = {}
    for name, text, info in parts:
        engine = (info or {}).get("engine_id")
        grouped.setdefault(f"{name}: {text}", []).append("?" if engine is None else str(engine))
    if len(grouped) == 1:
        return next(iter(grouped))
    return "\n".join(
        f"engine{'s' if len(e) > 1 else ''} {', '.join(e)}: {t}" for t, e in grouped.items()
    )


def show_error(
    shell: Any,
    etype: type[BaseException],
    value: BaseException,
    tb: TracebackType | None,
    tb_offset: int | None = None,
) -> list[str]:
    """IPython's custom exception handler for nbckpt's errors (see :func:`install`).

    Prints the error's message to stderr without a traceback, and keeps the exception
    in ``sys.last_value`` (and ``sys.last_type``, ``sys.last_traceback``), from which
    ``%tb`` prints the traceback. An error it does not make compact is shown as IPython
    would have shown it.

    Returns
    -------
    list of str
        Nothing: IPython discards what a handler returns from a cell, and the message
        is printed already.
    """
    text = compact_text(value)
    if text is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return []
    shell._get_exc_info((etype, value, tb))  # sets sys.last_*: what %tb shows
    print(text, file=sys.stderr)
    return []


def install(shell: Any) -> None:
    """Show nbckpt's errors compactly in ``shell``; called by ``%load_ext nbckpt``.

    Exceptions another extension registered with ``set_custom_exc`` keep their handler.
    Safe to call again (a cluster start calls it once ipyparallel is imported, so that
    ``RemoteError`` is caught too).
    """
    ours: tuple[type[BaseException], ...] = (NbckptError, *_remote_errors())
    previous = tuple(getattr(shell, "custom_exceptions", ()) or ())
    handler = getattr(shell, "CustomTB", None)
    if getattr(shell, "_nbckpt_custom_exc", None) is not None:
        previous, handler = shell._nbckpt_custom_exc
    others = tuple(e for e in previous if e not in ours)

    def handle(
        ip: Any,
        etype: type[BaseException],
        value: BaseException,
        tb: TracebackType | None,
        tb_offset: int | None = None,
    ) -> list[str]:
        if isinstance(value, ours) or not others or handler is None:
            return show_error(ip, etype, value, tb, tb_offset)
        result: list[str] = handler(etype, value, tb, tb_offset=tb_offset) or []
        return result

    shell._nbckpt_custom_exc = (others, handler if others else None)
    shell.set_custom_exc((*ours, *others), handle)
