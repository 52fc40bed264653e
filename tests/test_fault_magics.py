"""%ckpt_fault, the health view and recovery, over a real cluster of JAX engines."""

from __future__ import annotations

import time

import ipyparallel as ipp
import pytest
from IPython.core.error import UsageError

from nbckpt.session.client import SaveFailedError
from nbckpt.session.cluster import ClusterError, ClusterGoneError

pytestmark = pytest.mark.multihost

BUILD = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("data",))
full = np.arange(48 * 8, dtype=np.float32).reshape(48, 8)
state = {"w": jax.make_array_from_callback((48, 8), NamedSharding(mesh, P("data")),
                                           lambda idx: full[idx])}
"""
CHECK = """
ok = all(np.array_equal(s.data, full[s.index]) for s in restored["w"].addressable_shards)
"""


@pytest.fixture(scope="module")
def env(ip, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    ip.run_line_magic("ckpt_cluster", f"start -n 3 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    ip.run_cell_magic("px", "", BUILD)
    yield {"ip": ip, "root": root, "magics": magics}
    if magics.cluster is not None:
        magics.cluster.stop()
        magics.cluster = magics.client = None


@pytest.mark.parametrize(
    "line,message",
    [
        ("kill", "needs --process"),
        ("stall --process 1 --seconds 2", "needs --at PHASE"),
        ("stall --process 1 --at write", "--seconds"),
        ("slow-io --process 0 --factor 0.5", "--factor F >= 1"),
        ("fail-io --process 1 --at nowhere", "invalid choice"),
        ("explode --process 1", "invalid choice"),
        ("kill --process 7", "one of 0..2"),
    ],
)
def test_fault_usage_errors(env, line, message):
    with pytest.raises(UsageError, match=message):
        env["ip"].run_line_magic("ckpt_fault", line)


def test_stall_slow_io_list_and_clear(env, capsys):
    ip = env["ip"]
    ip.run_line_magic("ckpt_fault", "stall --process 1 --at barrier:write_complete --seconds 1.5")
    ip.run_line_magic("ckpt_fault", "slow-io --process 2 --factor 3")
    ip.run_line_magic("ckpt_fault", "list")
    out = capsys.readouterr().out
    assert "process 1: stall 1.5 s at barrier:write_complete" in out
    assert "process 2: slow-io x3" in out and "process 0: no faults" in out
    t0 = time.monotonic()
    ip.run_line_magic("ckpt_save", "state --step 1 --wait")
    assert time.monotonic() - t0 >= 1.5  # the stalled process held the barrier
    assert "step 1 committed" in capsys.readouterr().out
    ip.run_line_magic("ckpt_fault", "clear")
    ip.run_line_magic("ckpt_fault", "list")
    assert capsys.readouterr().out.count("no faults") == 3


def test_faults_and_status_reach_engines_busy_in_a_noblock_loop(env, capsys):
    # The review: behind a %%px --noblock loop %ckpt_fault blocked the notebook or
    # failed after 30 s (and might arm later), and %ckpt_status called the engines idle.
    ip = env["ip"]
    loop = ip.run_cell_magic("px", "--noblock", "import time\nfor _ in range(80): time.sleep(0.1)")
    assert isinstance(loop, ipp.AsyncResult)
    try:
        ip.run_line_magic("ckpt_fault", "stall --process 1 --at write --seconds 0.5")
        ip.run_line_magic("ckpt_status", "")
        out = capsys.readouterr().out
        assert not loop.ready()  # armed and reported while the loop still runs
        line = next(ln for ln in out.splitlines() if ln.startswith("process 1: host"))
        assert "running a cell" in line and line.endswith("faults armed: stall 0.5 s at write")
        assert all("running a cell" in ln for ln in out.splitlines() if ": host " in ln)
        ip.run_line_magic("ckpt_fault", "clear")
        ip.run_line_magic("ckpt_fault", "list")
        assert capsys.readouterr().out.count("no faults") == 3 and not loop.ready()
    finally:
        loop.get(timeout=60)
    ip.run_line_magic("ckpt_status", "")
    assert capsys.readouterr().out.count(", idle") == 3


def test_fail_io_names_the_process(env):
    ip = env["ip"]
    ip.run_line_magic("ckpt_fault", "fail-io --process 1")
    try:
        with pytest.raises(SaveFailedError, match=r"process 1: OSError: .*injected I/O error") as e:
            ip.run_line_magic("ckpt_save", "state --step 2 --wait")
    finally:
        ip.run_line_magic("ckpt_fault", "clear")
    # The others gave up because of process 1: they follow the cause, not lead it.
    assert "(then processes 0, 2 gave up); nothing was committed for this step" in str(e.value)
    assert not (env["root"] / "2").exists()


def test_a_failed_forced_resave_keeps_the_old_step_and_says_so(env):
    ip, root = env["ip"], env["root"]
    committed = sorted(p.name for p in (root / "1").rglob("*"))
    ip.run_line_magic("ckpt_fault", "fail-io --process 2")
    try:
        with pytest.raises(SaveFailedError) as e:
            ip.run_line_magic("ckpt_save", "state --step 1 --force --wait")
    finally:
        ip.run_line_magic("ckpt_fault", "clear")
    msg = str(e.value)
    assert "process 2: OSError" in msg and "nothing was committed" not in msg
    assert msg.endswith("; the previously committed step 1 is untouched")
    assert sorted(p.name for p in (root / "1").rglob("*")) == committed
    # The failure was reported: the next restore does not raise it a second time.
    ip.run_line_magic("ckpt_restore", "state --step 1")


def test_kill_then_status_restart_and_restore(env, capsys):
    ip, magics = env["ip"], env["magics"]
    ip.run_line_magic("ckpt_fault", "kill --process 2 --at write")
    handle = ip.run_line_magic("ckpt_save", "state --step 3")
    t0 = time.monotonic()
    with pytest.raises(SaveFailedError, match="process 2 died"):
        handle.wait(timeout_s=60)
    assert time.monotonic() - t0 < 10
    # The widget followed the save past the first failure, until both survivors had
    # given up, and shows the killed process dead, with the evidence.
    widget = magics.views[handle.op]
    assert widget.live is not None and widget.live.join(60)
    assert widget.status == "failed"
    assert [r["status"] for r in widget.rows] == ["failed", "failed", "dead"]
    dead = widget.rows[2]
    assert dead["phase"] == "dead" and dead["dead_reported_by"] == [0, 1]
    assert "no event since +" in dead["note"] and "processes 0, 1 report it died" in dead["note"]
    capsys.readouterr()
    ip.run_line_magic("ckpt_show", handle.op)
    assert "processes 0, 1 report it died" in capsys.readouterr().out
    capsys.readouterr()
    ip.run_line_magic("ckpt_status", "")
    out = capsys.readouterr().out
    assert "process 2 dead" in out and "process 0 alive" in out
    with pytest.raises(ClusterError, match=r"^process 2 died; .* %ckpt_cluster restart"):
        ip.run_line_magic("ckpt_save", "state --step 4")
    # A barrier or a restore with a dead process: the same one line, never a KeyError.
    for line in ("ckpt_barrier b", "ckpt_restore restored"):
        with pytest.raises(ClusterError, match=r"^process 2 died"):
            ip.run_line_magic(*line.split(" ", 1))
    ip.run_line_magic("ckpt_cluster", "restart")
    assert "fresh JAX processes ready" in capsys.readouterr().out
    # %px after a restart blocks as after a start: an error on the engines raises here
    # (a non-blocking %px would return at once and the error would go unseen).
    with pytest.raises(ipp.error.RemoteError) as raised:
        ip.run_cell_magic("px", "", "raise ValueError('failing on purpose')")
    # Once streamed, ipyparallel raises a short form that wraps the engines' errors.
    error = getattr(raised.value, "original_error", raised.value)
    assert str(error).count("ValueError: failing on purpose") == 3
    ip.run_line_magic("ckpt_restore", "restored")
    assert "restored step 1" in capsys.readouterr().out
    ip.run_cell_magic("px", "", BUILD + CHECK)
    assert magics.cluster.view.apply_sync(_get_ok) == [True, True, True]


def test_process_0_death_is_reported_within_2_s(env, capsys):
    ip, magics = env["ip"], env["magics"]
    ip.run_line_magic("ckpt_fault", "kill --process 0")
    t0 = time.monotonic()
    while 0 not in magics.cluster.dead_processes() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(ClusterGoneError, match="the JAX cluster is gone"):
        ip.run_line_magic("ckpt_save", "state --step 9")
    capsys.readouterr()
    ip.run_line_magic("ckpt_status", "")
    out = capsys.readouterr().out
    assert "the JAX cluster is gone" in out and "%ckpt_cluster restart" in out


def _get_ok():
    import ipyparallel

    return ipyparallel.interactive(lambda: ok)()  # noqa: F821 - defined on the engines
