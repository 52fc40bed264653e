"""Shared fixtures: real JAX process groups on 127.0.0.1, started once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from IPython.core.interactiveshell import InteractiveShell

from nbckpt.procgroup import ProcessGroup

REPO = Path(__file__).resolve().parent.parent
# The default suite draws the same examples on every run, so a submission passes or
# fails on its code, not on the day's draw. ``HYPOTHESIS_PROFILE=explore`` searches
# afresh (random seed, more examples): run it when changing parsers or the engine.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

_ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="session")
def group4() -> Iterator[ProcessGroup]:
    """Four JAX processes with two CPU devices each (eight devices in all)."""
    with ProcessGroup(4, devices_per_process=2, env=_ENV) as group:
        yield group


@pytest.fixture(scope="session")
def group2() -> Iterator[ProcessGroup]:
    """Two JAX processes with one CPU device each."""
    with ProcessGroup(2, devices_per_process=1, env=_ENV) as group:
        yield group


@pytest.fixture(scope="session")
def group1() -> Iterator[ProcessGroup]:
    """One JAX process (no coordination service) with two CPU devices."""
    with ProcessGroup(1, devices_per_process=2, env=_ENV) as group:
        yield group


@pytest.fixture(scope="session")
def ip() -> InteractiveShell:
    """The IPython shell the magic tests drive, with ``%load_ext nbckpt`` done."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbckpt")
    return shell


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    """pytest-jupyter's server, with nbckpt's routes (the server and S3 route tests)."""
    return {"ServerApp": {"jpserver_extensions": {"nbckpt": True}}}
