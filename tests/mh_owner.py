"""Process-side tasks of the ownership and agreement tests (one call per process)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.errors import NbckptError


def values(seed: int) -> dict[str, np.ndarray]:
    """The tree a job saves: the same on every process, distinct per ``seed``."""
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((16, 8)).astype(np.float32), "n": np.arange(5) + seed}


def _gate(phase: str, gate: str) -> None:
    """At ``phase``, say so (``<gate>/reached``) and wait for ``<gate>/go``."""
    folder = Path(gate)

    def hold(_phase: str) -> None:
        (folder / "reached").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    hooks.clear_hooks()
    hooks.set_hook(phase, hold)


def held_save(root: str, step: int, seed: int, phase: str, gate: str, **kw: Any) -> dict[str, Any]:
    """Save ``values(seed)`` as ``step``, pausing at ``phase`` until the test says go."""
    _gate(phase, gate)
    try:
        with AsyncCheckpointer(root) as ckptr:
            ckptr.save(step, values(seed), **kw)
            ckptr.wait_until_finished()
            return {"error": None, "op": ckptr.last_op, "pid": os.getpid()}
    except NbckptError as e:
        return {"error": f"{type(e).__name__}: {e}", "pid": os.getpid()}
    finally:
        hooks.clear_hooks()


def save_disagreeing(root: str, step: int, what: str, odd: int) -> str | None:
    """Save ``step`` on every process; process ``odd`` differs in ``what``; the error."""
    tree: dict[str, Any] = dict(values(1))
    kw: dict[str, Any] = {"timeout_s": 30}
    if jax.process_index() == odd:
        if what == "format":
            kw["format"] = "orbax"
        elif what == "mode":
            kw["mode"] = "commit_file"
        elif what == "leaf":
            tree["extra"] = np.zeros(3, np.float32)
        elif what == "shape":
            tree["w"] = np.zeros((16, 9), np.float32)
        elif what == "force":
            kw["force"] = True
    try:
        ckptr = AsyncCheckpointer(root)
        ckptr.save(step, tree, **kw)
        ckptr.wait_until_finished()
    except NbckptError as e:
        return f"{type(e).__name__}: {e}"
    return None


# -- the two-process state machine (tests/test_stateful.py) ---------------------------

_jobs: dict[str, AsyncCheckpointer] = {}


def sm_open(root: str) -> None:
    _jobs[root] = AsyncCheckpointer(root)


def sm_save(
    root: str, step: int, seed: int, mode: str, force: bool, phase: str | None, victim: int
) -> tuple[str | None, bool]:
    """Save (``victim`` fails at ``phase`` if one is given); the error's class, committed."""
    from nbckpt.errors import CheckpointError

    def boom(_phase: str) -> None:
        raise OSError(5, f"injected at {_phase}")

    hooks.clear_hooks()
    if phase is not None and jax.process_index() == victim:
        hooks.set_hook(phase, boom)
    ckptr = _jobs[root]
    try:
        ckptr.save(step, values(seed), mode=mode, force=force)  # type: ignore[arg-type]
        ckptr.wait_until_finished()
    except CheckpointError as e:
        return type(e).__name__, e.committed
    except NbckptError as e:
        return type(e).__name__, False
    finally:
        hooks.clear_hooks()
    return None, False


def sm_prune(root: str, step: int) -> list[int]:
    return _jobs[root].prune_after(step)


def sm_retention(root: str, max_to_keep: int | None) -> None:
    from nbckpt.formats.retention import RetentionPolicy

    _jobs[root].set_retention(RetentionPolicy(max_to_keep=max_to_keep))


def sm_restores(root: str, step: int, seed: int) -> bool:
    got = _jobs[root].restore(step)
    want = values(seed)
    return all(np.asarray(got[k]).tobytes() == want[k].tobytes() for k in want)


def sm_close(root: str) -> None:
    _jobs.pop(root).close()


def service_keys(root: str, saves: int) -> list[str]:
    """Save ``saves`` steps and restore the last; the operations the service still keys.

    Process 0 (the primary, which drops the keys of earlier operations) answers; the
    others answer an empty list.
    """
    from nbckpt.engine import default_client
    from nbckpt.engine.save import preflight

    ck = AsyncCheckpointer(root)
    for step in range(saves):
        ck.save(step, values(step))
        ck.wait_until_finished()
    ck.restore(saves - 1)
    if jax.process_index() != 0:
        return []
    preflight._dropping.get().submit(lambda: None).result()  # its drops are done
    keys = default_client().key_value_dir_get("nbckpt")
    return sorted({key.split("/")[1] for key in keys})
