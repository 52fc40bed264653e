"""AsyncCheckpointer in this (single) process, writing real files with tensorstore."""

import json
import threading
import time

import jax
import numpy as np
import pytest

from nbckpt.engine import AsyncCheckpointer, all_steps, hooks, latest_step
from nbckpt.errors import (
    CheckpointError,
    RootNotWritableError,
    StepExistsError,
    StepNotFoundError,
)
from nbckpt.formats.layout import COMMIT_FILE, METADATA_FILE
from nbckpt.journal import list_operations, read_operation


@pytest.fixture(autouse=True)
def _no_hooks():
    hooks.clear_hooks()
    yield
    hooks.clear_hooks()


def _state(k=1.0):
    return {
        "w": jax.numpy.arange(64.0).reshape(8, 8) * k,
        "host": np.arange(6, dtype=np.int16),
        "scalars": [3, 0.5, True, 1 + 2j],
        "one": np.float64(k),
    }


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_save_restore_round_trip_and_layout(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    ck.save(5, _state())
    ck.wait_until_finished()
    assert all_steps(tmp_path) == [5]
    assert not (tmp_path / "5.nbckpt-tmp").exists()
    meta = json.loads((tmp_path / "5" / METADATA_FILE).read_text())
    assert meta["step"] == 5 and meta["mode"] == "rename" and meta["process_count"] == 1
    out = ck.restore()
    ref = _state()
    assert _same(out["w"], ref["w"]) and isinstance(out["w"], jax.Array)
    assert _same(out["host"], ref["host"]) and _same(out["one"], ref["one"])
    assert out["scalars"] == [3, 0.5, True, 1 + 2j]
    assert [type(v) for v in out["scalars"]] == [int, float, bool, complex]


def test_arrays_are_plain_zarr_readable_without_nbckpt(tmp_path):
    import tensorstore as ts

    ck = AsyncCheckpointer(tmp_path, pack_bytes=0)  # small leaves are packed by default
    ck.save(1, _state())
    ck.wait_until_finished()
    arr = ts.open(
        {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "1" / "w")}}
    ).result()
    assert _same(arr.read().result(), _state()["w"])


def test_numpy_is_copied_at_save_time(tmp_path):
    hooks.set_hook("write", lambda _p: time.sleep(0.3))
    state = _state()
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, state)
    state["host"][:] = -1  # mutate while the background write waits
    ck.wait_until_finished()
    assert _same(ck.restore(1)["host"], np.arange(6, dtype=np.int16))


def test_save_returns_before_commit_and_second_save_waits(tmp_path):
    release = threading.Event()
    hooks.set_hook("finalize", lambda _p: release.wait(10))
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    assert ck.in_flight()
    deadline = time.monotonic() + 10
    while not (tmp_path / "1.nbckpt-tmp").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "1.nbckpt-tmp").is_dir()  # written, held before finalize
    assert latest_step(tmp_path) is None  # a temporary directory is never a step
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    ck.save(2, _state(2.0))  # waits for step 1 first
    assert time.monotonic() - t0 >= 0.2
    assert all_steps(tmp_path) == [1]
    ck.wait_until_finished()
    assert all_steps(tmp_path) == [1, 2]


def test_commit_file_mode(tmp_path):
    ck = AsyncCheckpointer(tmp_path, mode="commit_file")
    ck.save(3, _state())
    ck.wait_until_finished()
    assert (tmp_path / "3" / COMMIT_FILE).is_file()
    assert all_steps(tmp_path) == [3]
    assert _same(ck.restore(3)["w"], _state()["w"])


def test_existing_step_is_refused_and_force_replaces_it(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    ck.wait_until_finished()
    with pytest.raises(StepExistsError, match=str(tmp_path / "1")):
        ck.save(1, _state(9.0))
    assert _same(ck.restore(1)["w"], _state()["w"])  # untouched
    ck.save(1, _state(9.0), force=True)
    ck.wait_until_finished()
    assert _same(ck.restore(1)["w"], _state(9.0)["w"])
    assert all_steps(tmp_path) == [1]


def test_root_not_writable_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ck = AsyncCheckpointer(blocker / "ckpt")
    with pytest.raises(RootNotWritableError, match="not writable from process 0"):
        ck.save(1, _state())
    assert not ck.in_flight()


def test_unsupported_leaf_is_a_type_error_naming_the_path(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    with pytest.raises(TypeError, match=r"\['opt'\]\['name'\] is a str"):
        ck.save(1, {"opt": {"name": "adam"}})
    assert list_operations(tmp_path) == []  # nothing started


def test_restore_missing_step_lists_existing(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    with pytest.raises(StepNotFoundError, match="no complete checkpoint"):
        ck.restore()
    ck.save(4, _state())
    ck.wait_until_finished()
    with pytest.raises(StepNotFoundError, match="complete steps there: 4"):
        ck.restore(7)


def test_background_error_is_raised_once_and_nothing_is_committed(tmp_path):
    def boom(_phase):
        raise OSError(28, "No space left on device")

    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    ck.wait_until_finished()
    hooks.set_hook("write", boom)
    ck.save(2, _state())
    with pytest.raises(CheckpointError, match="during write: OSError") as info:
        ck.check_for_errors() if not ck.in_flight() else ck.wait_until_finished()
    assert info.value.step == 2
    ck.check_for_errors()  # raised once only
    assert all_steps(tmp_path) == [1]
    rec = read_operation(tmp_path, info.value.op)
    assert rec.status == "failed" and "No space left" in rec.processes[0].error
    hooks.clear_hooks()
    ck.save(2, _state())  # the abandoned temporary directory does not block a retry
    ck.wait_until_finished()
    assert all_steps(tmp_path) == [1, 2]


def test_max_to_keep_removes_oldest(tmp_path):
    ck = AsyncCheckpointer(tmp_path, max_to_keep=2)
    for step in range(4):
        ck.save(step, _state(step))
    ck.close()
    assert all_steps(tmp_path) == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".nbckpt") == ["2", "3"]


def test_partial_restore_and_target_types(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    ck.wait_until_finished()
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sds = jax.ShapeDtypeStruct((8, 8), jax.numpy.float32, sharding=dev)
    out = ck.restore(1, target={"w": sds, "host": ...}, partial=True)
    assert set(out) == {"w", "host"}
    assert _same(out["w"], _state()["w"])
    with pytest.raises(KeyError, match=r"\['nope'\] is not in"):
        ck.restore(1, target={"nope": dev}, partial=True)
    bad = jax.ShapeDtypeStruct((4, 4), jax.numpy.float32, sharding=dev)
    with pytest.raises(ValueError, match="saved shape is"):
        ck.restore(1, target={"w": bad}, partial=True)


def test_journal_records_every_phase(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    ck.save(1, _state())
    ck.wait_until_finished()
    rec = read_operation(tmp_path, ck.last_op)
    assert rec.status == "committed"
    phases = [p.name for p in rec.processes[0].phases]
    assert phases == [
        "snapshot",
        "barrier:tmp_ready",
        "write",
        "barrier:write_complete",
        "finalize",
        "barrier:commit_complete",
    ]
    events = [e["event"] for e in rec.processes[0].events]
    assert events[0] == "requested" and events[-1] == "committed"
    assert rec.processes[0].bytes_written == rec.processes[0].bytes_total > 0


def test_bad_options_and_closed(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        AsyncCheckpointer(tmp_path, mode="copy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="primary"):
        AsyncCheckpointer(tmp_path, primary=3)
    with pytest.raises(ValueError, match="step"):
        AsyncCheckpointer(tmp_path).save(-1, {})
    ck = AsyncCheckpointer(tmp_path)
    ck.close()
    with pytest.raises(Exception, match="closed"):
        ck.save(1, _state())


def test_the_checkpointer_is_its_collaborators(tmp_path):
    # The seams the class was split along: its read side, the processes (Context), the
    # save in flight (InFlight); a closed checkpointer is a usage error.
    from nbckpt.engine.context import Context
    from nbckpt.engine.reader import CheckpointReader
    from nbckpt.errors import CallError, PeerFailedError

    ck = AsyncCheckpointer(tmp_path)
    assert isinstance(ck, CheckpointReader)
    assert isinstance(ck._ctx, Context) and ck._ctx.root == ck.root
    assert ck._ctx.primary == ck.options.primary == 0
    with pytest.raises(ValueError, match="primary"):
        Context.connect(ck.root, 1, None)
    ck.save(1, _state())
    assert ck.last_op is not None and ck._inflight.job is not None
    assert ck._inflight.job.op == ck.last_op
    ck.wait_until_finished()
    assert not ck._inflight.running() and ck._thread is None
    op = ck.last_op
    assert ck.restore(1)["one"] == 1.0 and ck.last_op != op
    ck.close()
    with pytest.raises(CallError, match="closed"):
        ck.restore(1)
    # A failure a peer reported reaches the background save's error as data.
    ck2 = AsyncCheckpointer(tmp_path)

    def peer_failed(_phase):
        raise PeerFailedError(3, "disk full", failures={3: "disk full", 5: "gone"})

    hooks.set_hook("write", peer_failed)
    ck2.save(2, _state())
    with pytest.raises(CheckpointError) as info:
        ck2.wait_until_finished()
    assert info.value.failures == {3: "disk full", 5: "gone"}
    assert all_steps(tmp_path) == [1]
