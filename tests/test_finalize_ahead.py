"""The primary prepares its finalize while the shards are written, and never after a failure."""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, hooks
from nbckpt.engine.save.background import SaveJob
from nbckpt.errors import CheckpointError
from nbckpt.formats.fsck import verify_step
from nbckpt.formats.layout import is_complete, step_dir, tmp_dir
from nbckpt.formats.records import METADATA_FILE
from nbckpt.protocol import Barrier, Phase, barrier_phase

#: 8 MiB: above the packing bound, so "w" is an array of its own, with a .zarray.
N = 1 << 21


def _state() -> dict[str, Any]:
    return {"w": jnp.arange(N, dtype=jnp.float32), "b": jnp.ones(8, jnp.float32), "n": 3}


def test_the_primary_renders_its_metadata_while_the_shards_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ahead for nbckpt's layout; after every write for Orbax's, whose merge needs them."""
    ahead: list[bool] = []
    real = SaveJob._prepare_finalize

    def spy(self: SaveJob, work: Any, **kw: Any) -> Any:
        ahead.append(threading.current_thread().name.startswith("nbckpt-finalize"))
        return real(self, work, **kw)

    monkeypatch.setattr(SaveJob, "_prepare_finalize", spy)
    for fmt in ("nbckpt", "orbax"):
        with AsyncCheckpointer(tmp_path / fmt) as ck:
            t0 = time.time()
            ck.save(1, _state(), format=fmt)
            ck.wait_until_finished()
            out = ck.restore(1)
        step = step_dir(tmp_path / fmt, 1)
        assert verify_step(step) == []
        assert np.array_equal(np.asarray(out["w"]), np.arange(N, dtype=np.float32))
        meta = json.loads((step / METADATA_FILE).read_text())
        # Stamped when it was written, after the render: every field is there once.
        assert meta["step"] == 1 and meta["time_requested"] <= meta["time_finalized"]
        assert t0 <= meta["time_finalized"] <= time.time()
    assert ahead == [True, False]


def test_a_save_that_fails_meanwhile_returns_only_once_the_render_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing of a failed save writes into its working directory after its error."""
    failing = threading.Event()
    ended: list[float] = []
    real = SaveJob._prepare_finalize

    def slow(self: SaveJob, work: Any, **kw: Any) -> Any:
        failing.wait(30)
        time.sleep(0.3)  # still writing the arrays' records when the save fails
        try:
            return real(self, work, **kw)
        finally:
            ended.append(time.monotonic())

    def boom(_: str) -> None:
        failing.set()
        raise OSError(errno.EIO, "injected: the disk failed")

    monkeypatch.setattr(SaveJob, "_prepare_finalize", slow)
    hooks.set_hook(barrier_phase(Barrier.WRITE_COMPLETE), boom)
    try:
        with AsyncCheckpointer(tmp_path, timeout_s=30) as ck:
            ck.save(1, _state())
            with pytest.raises(CheckpointError, match="disk failed") as err:
                ck.wait_until_finished()
            raised = time.monotonic()
    finally:
        hooks.clear_hooks()
    assert ended and ended[0] <= raised
    assert err.value.phase == barrier_phase(Barrier.WRITE_COMPLETE)
    assert not is_complete(step_dir(tmp_path, 1))


def test_a_render_that_fails_fails_the_save_before_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: SaveJob, work: Any, **kw: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    with AsyncCheckpointer(tmp_path, timeout_s=30) as ck:
        ck.save(1, _state())
        ck.wait_until_finished()
        monkeypatch.setattr(SaveJob, "_prepare_finalize", full)
        ck.save(2, _state())
        with pytest.raises(CheckpointError, match="No space left") as err:
            ck.wait_until_finished()
    assert err.value.phase == Phase.FINALIZE
    assert is_complete(step_dir(tmp_path, 1)) and not is_complete(step_dir(tmp_path, 2))
    assert not (tmp_dir(tmp_path, 2) / METADATA_FILE).exists()


def test_a_working_directory_removed_under_the_save_is_not_brought_back(tmp_path: Path) -> None:
    """The records are not written into a directory that is no longer the save's."""
    root = tmp_path / "ckpt"
    hooks.set_hook("write", lambda _p: shutil.rmtree(tmp_dir(root, 1)))
    try:
        with AsyncCheckpointer(root, timeout_s=30) as ck:
            ck.save(1, _state())
            with pytest.raises(CheckpointError, match="vanished during the save"):
                ck.wait_until_finished()
    finally:
        hooks.clear_hooks()
    assert not tmp_dir(root, 1).exists() and not is_complete(step_dir(root, 1))
