"""Functions the object-store tests run inside real JAX processes.

Each takes the store's environment (S3's endpoint, region and keys; GCS's endpoint and
token) as an argument and puts it in ``os.environ`` first, as a user's job script would
have it: the process group outlives any one server, and nbckpt reads the environment
when it names an ``s3://`` or ``gs://`` root.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import NbckptError
from tests import mh_tasks

# One checkpointer per root, options and store: a root is read against the store its
# environment named when the checkpointer was made (the same URL on another server is
# another store).
_checkpointers: dict[tuple[str, str, str], AsyncCheckpointer] = {}


def _env(env: dict[str, str]) -> None:
    os.environ.update(env)


def _ckptr(root: str, **options: Any) -> AsyncCheckpointer:
    key = (root, repr(sorted(options.items())), repr(sorted(os.environ.items())))
    if key not in _checkpointers:
        _checkpointers[key] = AsyncCheckpointer(root, **options)
    return _checkpointers[key]


def save(env: dict[str, str], root: str, step: int, **options: Any) -> dict[str, Any]:
    """Save ``mh_tasks``'s state of ``step``; return the op, or the error's text and type."""
    _env(env)
    force = bool(options.pop("force", False))
    t0 = time.time()
    try:
        ckptr = _ckptr(root, **options)
        ckptr.save(step, mh_tasks.make_state(step), force=force)
        ckptr.wait_until_finished()
    except NbckptError as e:
        return {"error": str(e), "type": type(e).__name__, "t": time.time(), "s": time.time() - t0}
    return {"error": None, "op": ckptr.last_op, "mode": ckptr.options.mode, "t": time.time()}


def restore_check(env: dict[str, str], root: str, step: int | None, expect: int) -> list[str]:
    """Restore into ``mh_tasks``'s target; return what differs from ``expect``'s state."""
    _env(env)
    state = AsyncCheckpointer(root).restore(step, target=mh_tasks.target())
    return mh_tasks.check_state(state, expect)


def restore_op(env: dict[str, str], root: str, step: int) -> tuple[str | None, list[str]]:
    """Restore into ``mh_tasks``'s target; the restore's op, and what differs."""
    _env(env)
    ckptr = AsyncCheckpointer(root)
    state = ckptr.restore(step, target=mh_tasks.target())
    return ckptr.last_op, mh_tasks.check_state(state, step)


def restore_error(env: dict[str, str], root: str, step: int | None) -> str | None:
    """Restore; return the error's text, or None."""
    _env(env)
    try:
        AsyncCheckpointer(root).restore(step, target=mh_tasks.target())
    except NbckptError as e:
        return str(e)
    return None


def arm_kill(process: int, phase: str, marker: str) -> None:
    """On ``process``, write the time to ``marker`` and SIGKILL itself when ``phase`` starts."""
    mh_tasks.arm_kill_with_marker(process, phase, marker)


def clear_hooks() -> None:
    hooks.clear_hooks()


def process_index() -> int:
    return jax.process_index()
