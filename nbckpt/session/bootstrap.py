"""Engine-side: how the engines nbckpt starts come up, and what they answer before the join.

The engines nbckpt starts locally or over ssh run :func:`engine_main`, which imports
:data:`PRELOAD` (jax, tensorstore, nbckpt's engine) before the engine starts (a local
engine, while the controller starts), so that joining the JAX job does not begin with
a second of imports on every engine.

This module ships with the kernel's side (:mod:`nbckpt.session`) but runs on the
engines: they import it by name (:data:`ENGINE_MAIN`, :data:`PROBE`, :data:`JOIN`). So
it imports neither jax nor IPython at import time, and holds no state of the kernel.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from nbckpt.session.rpc import AGENT, PROCESS, RELAY, last_line

__all__ = [
    "ENGINE_MAIN",
    "JOIN",
    "PRELOAD",
    "PROBE",
    "SAFE_INFO",
    "engine_main",
    "join_engine",
    "preload_report",
    "probe_engine",
    "safe_info",
]

#: What the engines nbckpt starts import before they register (:func:`engine_main`):
#: all that joining the JAX job and the first save need. Imports only: none of them
#: touches a device, since JAX's backends must not exist before
#: ``jax.distributed.initialize``.
PRELOAD = ("jax", "tensorstore", PROCESS, AGENT, RELAY)

#: ``python -c`` code of the engines nbckpt starts locally and over ssh, in place of
#: ipyparallel's ``python -m ipyparallel.engine``.
ENGINE_MAIN = "from nbckpt.session.bootstrap import engine_main; engine_main()"

#: The engine-side functions below, by the names the kernel sends (see ``rpc.remote``).
PROBE = f"{__name__}:probe_engine"
JOIN = f"{__name__}:join_engine"
SAFE_INFO = f"{__name__}:safe_info"

#: What the early import of this engine did (see :func:`preload_report`).
_preload: dict[str, Any] = {}


def _run_preload() -> None:
    began = time.perf_counter()
    _preload.update(started=True, jax_before="jax" in sys.modules, error=None)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as e:  # the join imports them again, and reports what fails
        _preload["error"] = f"{type(e).__name__}: {last_line(str(e))}"
    finally:
        _preload["seconds"] = time.perf_counter() - began


def engine_main() -> None:
    """Run an ipyparallel engine that has imported :data:`PRELOAD` before it starts.

    Engine-side: what the engines nbckpt starts locally and over ssh run (``python -c``
    :data:`ENGINE_MAIN`, with ipyparallel's engine arguments after it). A local engine
    starts beside the controller, and imports while the controller writes its
    connection file. The imports run in the engine's only thread: in a background
    thread, beside the engine's registration, they raced with code that walks
    ``sys.modules`` (debugpy, imported while the engine registers, failed with
    "dictionary changed size during iteration"), and the engine exited unregistered.
    """
    if hasattr(signal, "SIGUSR1"):
        # An engine that never registers is asked for its stacks (arrivals.stuck): the
        # dump lands in its output file, which the error quotes.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    _run_preload()
    await_url_file(sys.argv)
    from ipyparallel.engine.app import main

    main()


def await_url_file(argv: list[str]) -> None:
    """Wait until the controller's engine connection file exists and parses.

    A local engine starts beside the controller and reads that file once it exists;
    the controller creates it before it writes it, so an engine that read it in between
    would die on half a file. Engines given ``$IPP_CONNECTION_INFO`` (ssh) read no file.
    """
    if os.environ.get("IPP_CONNECTION_INFO") or not os.environ.get("IPP_PROFILE_DIR"):
        return
    wait = [a.split("=", 1)[1] for a in argv if a.startswith("--IPEngine.wait_for_url_file=")]
    deadline = time.monotonic() + (float(wait[-1]) if wait else 30.0)
    cluster_id = os.environ.get("IPP_CLUSTER_ID")
    name = f"ipcontroller-{cluster_id}-engine.json" if cluster_id else "ipcontroller-engine.json"
    path = Path(os.environ["IPP_PROFILE_DIR"]) / "security" / name
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            json.loads(path.read_text())
            return
        time.sleep(0.02)
    # Past the deadline the engine itself says which file never came.


def preload_report() -> dict[str, Any]:
    """Engine-side: what this engine's early import of :data:`PRELOAD` did.

    Returns
    -------
    dict
        ``started``: whether the imports ran here, False for an engine that did not
        start with :func:`engine_main` (one you started yourself). If they did,
        ``jax_before`` (whether jax was imported before they began, which would leave
        them nothing to do), ``error`` (None, or the import's error) and ``seconds``
        (how long they took). After the join, ``jax_at_join`` (whether jax was in
        ``sys.modules`` when the join began).
    """
    return {"started": False, **_preload}


def probe_engine(toward: str, bind: str | None) -> dict[str, Any]:
    """Engine-side: :func:`~nbckpt.netaddr.host_info`, plus a port free on this host.

    The port is for the coordination service in case this engine becomes process 0:
    picked on ``bind``, or (None) on this host's address toward ``toward``. It needs no
    jax, so it answers at once from an engine that was not started with
    :func:`engine_main` either.
    """
    from nbckpt.netaddr import free_port, host_info

    info = host_info(toward)
    with contextlib.suppress(OSError):
        info["port"] = free_port(bind or info["address"] or "127.0.0.1")
    return info


def join_engine(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Engine-side: :func:`nbckpt.engine.sync.process.initialize`, noting what was imported."""
    _preload["jax_at_join"] = "jax" in sys.modules
    from nbckpt.engine.sync.process import initialize

    return initialize(*args, **kwargs)


def safe_info() -> dict[str, Any] | None:
    """Engine-side: report nbckpt's view of this engine without starting JAX."""
    if "jax" not in sys.modules:
        return {"initialized": False}
    from nbckpt.engine.sync import process

    return process.info()
