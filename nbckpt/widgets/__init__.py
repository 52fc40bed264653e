"""Live per-host views of an operation, and its timeline figure.

:func:`watch` returns a :class:`ProgressWidget` that follows an operation's journal by
itself; :func:`watch_runs` a table of every save under a root (``%ckpt_watch``);
:func:`plot_timeline` draws operations as a matplotlib figure;
:class:`TextProgress` draws tqdm bars per process for terminals. Submodules import
their dependencies (anywidget, matplotlib, tqdm) only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbckpt.widgets._watch import watch
    from nbckpt.widgets.progress import ProgressWidget
    from nbckpt.widgets.runs import watch_runs
    from nbckpt.widgets.text import TextProgress
    from nbckpt.widgets.timeline import plot_timeline

__all__ = ["ProgressWidget", "TextProgress", "plot_timeline", "watch", "watch_runs"]

_WHERE = {
    "ProgressWidget": "nbckpt.widgets.progress",
    "TextProgress": "nbckpt.widgets.text",
    "plot_timeline": "nbckpt.widgets.timeline",
    "watch": "nbckpt.widgets._watch",
    "watch_runs": "nbckpt.widgets.runs",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'nbckpt.widgets' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
