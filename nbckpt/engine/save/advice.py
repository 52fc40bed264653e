"""One line for a failed save: the error text, cleaned, and what to do about it."""

from __future__ import annotations

import re

from nbckpt.errors import NbckptError
from nbckpt.storage import Location, ObjectPath

__all__ = ["advice", "reason"]

_ADVICE = (
    (
        ("No space left", "ENOSPC", "errno 28"),
        "the disk holding {root} is full: free space or save to another directory",
    ),
    (
        ("Permission denied", "EACCES", "Read-only file system", "EROFS"),
        "a file or directory under {root} is not writable: fix its permissions",
    ),
    (
        ("No such file or directory", "ENOENT", "does not exist"),
        "a directory under {root} vanished during the save: check what removed it, then save again",
    ),
)

# tensorstore appends its whole JSON spec to errors; the path is already in the text.
_TS_SPEC = re.compile(r"\s*\[tensorstore_spec='.*'\]", re.DOTALL)


def advice(text: str, root: Location) -> str:
    """Say what to do about a storage error, from its text (tensorstore wraps errno)."""
    for needles, what in _ADVICE:
        if any(n in text for n in needles):
            return "; " + what.format(root=root)
    return ""


def reason(error: BaseException, root: Location) -> str:
    """One line for ``error``: its own text for nbckpt's errors, else ``Type: text``.

    A request to an object store that failed (a tensorstore error about an ``s3``
    spec, an HTTP status, a connection, or a timeout) is said the way the store's
    backend classifies it: what failed, at which URL, and what to do.
    """
    raw = str(error)
    if (
        isinstance(root, ObjectPath)
        and not isinstance(error, NbckptError)
        and root.failed_request(error)
    ):
        why = root.classify(error)
        return f"the store holding {root} failed: {why}; {root.advice(why)}"
    text = raw if isinstance(error, NbckptError) else f"{type(error).__name__}: {error}"
    text = " ".join(_TS_SPEC.sub("", text).split())
    return text + advice(text, root)
