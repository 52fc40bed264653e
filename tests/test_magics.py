"""The magics in a real IPython shell, over a real ipyparallel cluster of JAX engines."""

from __future__ import annotations

import re
import time
from pathlib import Path

import ipyparallel as ipp
import pytest
from IPython.core.error import UsageError

from nbckpt.errors import ClusterError
from nbckpt.magics.commands import NbckptMagics
from nbckpt.session.client import SaveFailedError
from nbckpt.session.cluster import JaxCluster, connection_files
from nbckpt.session.launch import SSHLauncher

BUILD = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("data",))
full = np.arange(32 * 4, dtype=np.float32).reshape(32, 4)
state = {"w": jax.make_array_from_callback((32, 4), NamedSharding(mesh, P("data")),
                                           lambda idx: full[idx]),
         "host": np.arange(3), "lr": 0.5}
only_on_1 = state if jax.process_index() == 1 else None
if jax.process_index() != 1:
    del only_on_1
"""

CHECK = """
ok = all(np.array_equal(a.data, b.data) and a.index == b.index
         for a, b in zip(restored["w"].addressable_shards, state["w"].addressable_shards))
ok = ok and np.array_equal(restored["host"], state["host"]) and restored["lr"] == 0.5
"""


@pytest.fixture(scope="module")
def cluster(ip, tmp_path_factory):
    root = tmp_path_factory.mktemp("magics")
    ip.run_line_magic("ckpt_cluster", f"start -n 2 --devices-per-process 2 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    yield {"root": root, "magics": magics}
    if magics.cluster is not None:
        magics.cluster.stop()


def _engines(magics, expr):
    return magics.cluster.view.apply_sync(_eval, expr)


def _eval(expr):  # runs on the engines
    import ipyparallel

    return ipyparallel.interactive(lambda e: eval(e, globals()))(expr)


def test_magic_before_any_cluster_says_how_to_start(ip):
    magics = NbckptMagics(ip)
    for call, line in [
        (magics.ckpt_save, "state --step 1"),
        (magics.ckpt_wait, ""),
        (magics.ckpt_barrier, "b"),
        (magics.ckpt_restore, "x"),
        (magics.ckpt_status, ""),
        (magics.ckpt_tiers, ""),
        (magics.ckpt_cluster, "stop"),
    ]:
        with pytest.raises(UsageError, match=r"%ckpt_cluster start"):
            call(line)


@pytest.mark.parametrize(
    "magic,line,message",
    [
        ("ckpt_save", "state", "--step"),
        ("ckpt_save", "state --step x", "whole number"),
        ("ckpt_save", "state --step -3", "0 or more"),
        ("ckpt_save", "state --step 1 --mode copy", "invalid choice"),
        ("ckpt_save", "state --step 1 --timeout 0", "above 0"),
        ("ckpt_save", "state --step 1 --timeout nan", "finite"),
        ("ckpt_barrier", "b --processes a,b", "indices like 0,2"),
        ("ckpt_barrier", "b --processes ,", "indices like 0,2"),
        ("ckpt_barrier", "../../x", "barrier name"),
        ("ckpt_restore", "x --timeout inf", "finite"),
        ("ckpt_save", 'state --step 1 --dir "/a b', "as a shell would"),
        ("ckpt_cluster", "explode", "invalid choice"),
        ("ckpt_restore", "", "arguments"),
        ("ckpt_wait", "now", "no arguments"),
    ],
)
def test_bad_arguments_give_usage_errors(ip, magic, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic(magic, line)


def test_help_comes_from_the_code(ip):
    doc = ip.find_line_magic("ckpt_save").__doc__
    assert "--mode {rename,commit_file}" in doc and "--force" in doc and "--wait" in doc
    assert "--processes" in ip.find_line_magic("ckpt_barrier").__doc__
    assert "--timeout SECONDS" in ip.find_line_magic("ckpt_restore").__doc__
    assert "--persistent " in doc
    tiers = ip.find_line_magic("ckpt_tiers").__doc__
    assert "--local DIR" in tiers and "--persistent-every M" in tiers and "{process}" in tiers


def test_a_bad_argument_names_the_usage(ip):
    with pytest.raises(UsageError, match=r"(?s)above 0.*usage: %ckpt_barrier"):
        ip.run_line_magic("ckpt_barrier", "b --timeout -1")


def test_cluster_save_barrier_restore_status_ls_stop(ip, cluster, capsys):
    magics, root = cluster["magics"], cluster["root"]
    out = capsys.readouterr().out
    ip.run_line_magic("ckpt_cluster", "status")
    out = capsys.readouterr().out
    assert "process 0: 2 of 4 devices" in out and "process 1: 2 of 4 devices" in out

    ip.run_cell_magic("px", "", BUILD)
    handle = ip.run_line_magic("ckpt_save", "state --step 1")
    assert handle is not None and handle.step == 1 and len(handle.blocked_s) == 2
    ip.run_line_magic("ckpt_wait", "")
    assert handle.status() == "committed"
    assert "step 1 committed" in capsys.readouterr().out

    ip.run_line_magic("ckpt_save", "state --step 2 --mode commit_file --wait")
    assert (root / "2" / "commit_success.txt").is_file()

    ip.run_line_magic("ckpt_barrier", "sync --processes 0,1")
    table = capsys.readouterr().out
    assert re.search(r"^\s+0\s+\d", table, re.M) and re.search(r"^\s+1\s+\d", table, re.M)

    ip.run_line_magic("ckpt_restore", "restored --step 1")
    assert "restored step 1 into 'restored' on 2 processes" in capsys.readouterr().out
    ip.run_cell_magic("px", "", CHECK)
    assert _engines(magics, "ok") == [True, True]

    # Restoring into a variable that exists lays it out like that variable.
    ip.run_line_magic("ckpt_restore", "restored")
    assert "restored step 2" in capsys.readouterr().out

    # Quotes are removed as a shell would: the directory's name has a space, no quotes.
    spaced = root / "a b"
    ip.run_line_magic("ckpt_save", f'state --step 3 --dir "{spaced}" --wait --quiet')
    assert (spaced / "3").is_dir()
    ip.run_line_magic("ckpt_restore", f"restored --dir '{spaced}' --timeout 60")
    assert "restored step 3" in capsys.readouterr().out
    ip.run_line_magic("ckpt_ls", f'"{spaced}"')
    assert re.search(r"^\s+3\s+complete", capsys.readouterr().out, re.M)

    ip.run_line_magic("ckpt_status", "")
    status = capsys.readouterr().out
    assert "process 1:" in status and "step 2 ->" in status and "committed" in status

    ip.run_line_magic("ckpt_ls", "")
    listing = capsys.readouterr().out
    assert re.search(r"^\s+1\s+complete", listing, re.M)
    assert re.search(r"^\s+2\s+complete", listing, re.M)
    with pytest.raises(UsageError, match="no directory"):
        ip.run_line_magic("ckpt_ls", str(root / "nope"))


def test_attach_finds_only_the_cluster_it_is_told(ip, cluster):
    # The notebook's cluster has a fresh id of its own; another client on this machine
    # is refused without that id (with the ids listed) and reaches it only with it.
    mine = cluster["magics"].cluster
    assert mine.cluster_id and mine.cluster_id in connection_files()
    with pytest.raises(ClusterError, match=rf"attach needs --cluster-id.*'{mine.cluster_id}'"):
        JaxCluster.attach()
    with pytest.raises(ClusterError, match=r"no cluster with id 'nope'.*clusters there"):
        JaxCluster.attach(cluster_id="nope")
    other = JaxCluster.attach(cluster_id=mine.cluster_id, timeout_s=30)
    try:
        assert other.engine_ids == mine.engine_ids and other.n == 2
        assert other.coordinator is None  # the engines were joined already: not again
        # nbckpt did not start these engines, so it refuses to restart them, and
        # stops nothing on the way.
        with pytest.raises(ClusterError, match="attached, so nbckpt cannot start"):
            other.restart()
        assert other.dead_processes() == [] and mine.dead_processes() == []
    finally:
        other.client.close()


def test_engines_import_jax_while_they_start_not_at_the_join(cluster):
    # Each engine imported jax and nbckpt's engine when it started (jax was not
    # imported before), without error, and the join found jax imported already, so it
    # did not start those imports itself.
    mine = cluster["magics"].cluster
    reports = mine.apply("nbckpt.session.cluster:preload_report", what="preload report")
    assert len(reports) == 2
    for report in reports:
        assert report["started"] and report["error"] is None, report
        assert report["jax_before"] is False and report["jax_at_join"] is True, report
    assert set(mine.timings) >= {"engines_s", "jax_init_s", "ready_s"}


def test_ssh_hosts_with_users_and_ports_are_dialled_as_ssh_takes_them():
    cluster = JaxCluster(engines="ssh", hosts=["h0"], ssh_config="/cfg")
    ssh = SSHLauncher(cluster.options).ssh_command
    assert ssh("me@h1:2222")[-3:] == ["-p", "2222", "me@h1"]
    assert ssh("h2")[:3] == ["ssh", "-F", "/cfg"] and ssh("h2")[-1] == "h2"
    assert "BatchMode=yes" in ssh("h2")  # a password prompt would hang the kernel


def test_engine_errors_name_the_processes(ip, cluster):
    with pytest.raises(ClusterError, match=r"processes 0, 1: StepExistsError: step already"):
        ip.run_line_magic("ckpt_save", "state --step 2")  # the newest: older is a rollback
    with pytest.raises(ClusterError, match=r"processes 0, 1: NameError: name 'nope'"):
        ip.run_line_magic("ckpt_save", "nope --step 9")
    # Defined on process 1 only: process 0 fails, and process 1 gives up on it (told of
    # the failure, or at the deadline if the news comes late).
    with pytest.raises(ClusterError) as info:
        ip.run_line_magic("ckpt_save", "only_on_1 --step 9 --timeout 2")
    msg = str(info.value)
    assert "process 0: NameError" in msg
    assert "process 0 failed: NameError" in msg or "process 0 did not arrive" in msg
    assert info.value.processes == [0, 1]


def test_a_failed_background_save_is_reported_once(ip, cluster):
    magics = cluster["magics"]
    magics.cluster.view.apply_sync(_fail_next_write)
    handle = ip.run_line_magic("ckpt_save", "state --step 5")
    with pytest.raises(SaveFailedError, match=r"failed on processes 0, 1: .*disk on fire"):
        handle.wait(timeout_s=60)
    magics.cluster.view.apply_sync(_clear_hooks)
    # The engines do not raise the same error again on the next save.
    ip.run_line_magic("ckpt_save", "state --step 5 --wait")
    assert (Path(cluster["root"]) / "5").is_dir()


def _fail_next_write():
    from nbckpt.engine import hooks

    def boom(_phase):
        raise OSError("disk on fire")

    hooks.set_hook("write", boom)


def _clear_hooks():
    from nbckpt.engine import hooks

    hooks.clear_hooks()


def test_retention_and_metrics_from_the_notebook(ip, cluster, capsys):
    import json

    from nbckpt.magics.commands import get_client

    root = Path(cluster["root"]) / "kept"
    ip.run_line_magic("ckpt_retention", f"--dir {root}")
    assert "keep every step" in capsys.readouterr().out
    ip.run_line_magic("ckpt_retention", f"--dir {root} --max-to-keep 1 --best 1 --metric loss")
    assert "the newest 1, the 1 with the lowest loss" in capsys.readouterr().out
    for step, loss in [(1, 0.5), (2, 0.1), (3, 0.9), (4, 0.7)]:
        ip.run_line_magic(
            "ckpt_save", f"state --step {step} --dir {root} --metric loss={loss} --wait --quiet"
        )
    assert sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) == [2, 4]
    assert json.loads((root / "2" / "_NBCKPT_METADATA").read_text())["metrics"] == {"loss": 0.1}
    client = get_client()
    assert not client.should_save(3, directory=root) and client.should_save(5, directory=root)
    ip.run_line_magic("ckpt_retention", f"--dir {root} --keep-all")
    assert "keep every step" in capsys.readouterr().out
    with pytest.raises(UsageError, match="usage: %ckpt_retention"):
        ip.run_line_magic("ckpt_retention", "--best 2")


def test_an_older_step_is_refused_until_rollback_removes_the_newer(ip, cluster, capsys):
    root = Path(cluster["root"]) / "rolled"
    for step in (1, 2, 3):
        ip.run_line_magic("ckpt_save", f"state --step {step} --dir {root} --wait --quiet")
    with pytest.raises(ClusterError, match=r"RollbackRefusedError: .*%ckpt_rollback 1") as info:
        ip.run_line_magic("ckpt_save", f"state --step 1 --dir {root} --force --wait --quiet")
    assert "\n" not in str(info.value)
    capsys.readouterr()
    ip.run_line_magic("ckpt_rollback", f"1 --dir {root}")
    assert "rolled back to step 1: removed 2, 3" in capsys.readouterr().out
    ip.run_line_magic("ckpt_save", f"state --step 2 --dir {root} --wait --quiet")
    assert sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) == [1, 2]


TIERED = """
full = np.arange(16, dtype=np.float32).reshape(8, 2)
tiered = jax.make_array_from_callback((8, 2), NamedSharding(mesh, P("data")), lambda i: full[i])
"""


def test_local_tier_from_the_notebook(ip, cluster, capsys, tmp_path):
    from nbckpt.magics.commands import get_client

    root = Path(cluster["root"]) / "tiered"
    ip.run_cell_magic("px", "", BUILD + TIERED)
    # Each process is a host of its own: {process} becomes its index on the engine.
    ip.run_line_magic(
        "ckpt_tiers", f"{root} --local {tmp_path}/host{{process}} --persistent-every 2"
    )
    assert "local tier on 2 host(s), 1 replica of each" in capsys.readouterr().out
    for step in (0, 1, 2):
        ip.run_line_magic("ckpt_save", f"tiered --step {step} --dir {root} --wait --quiet")
    capsys.readouterr()
    ip.run_line_magic("ckpt_tiers", str(root))
    out = capsys.readouterr().out
    assert re.search(r"^\s+2  yes\s+yes\s+\w+: 0,1  \w+: 0,1$", out, re.M), out
    assert re.search(r"^\s+1  yes\s+no\s+\w+: 0,1  \w+: 0,1$", out, re.M), out
    assert "in the root: 2, 0\n" in out  # step 0 only there: each host keeps 2 local steps
    assert "would read step 2 from the hosts' local copies" in out
    assert sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) == [0, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host0", "host1"]

    ip.run_line_magic("ckpt_save", f"tiered --step 3 --dir {root} --persistent --wait --quiet")
    assert sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) == [0, 2, 3]
    view = get_client().tiers(root)
    assert [(s["step"], s["recoverable"], s["persistent"]) for s in view["steps"]] == [
        (3, True, True),
        (2, True, True),
    ]
    assert view["restore"] == {"step": 3, "tier": "local"}
    ip.run_line_magic("ckpt_restore", f"back --dir {root}")
    assert "restored step 3 into 'back'" in capsys.readouterr().out
    ip.run_line_magic("ckpt_tiers", f"{root} --off")
    assert "no local tier" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"(?s)go with --local DIR.*usage: %ckpt_tiers"):
        ip.run_line_magic("ckpt_tiers", f"{root} --keep 3")


TRAIN_HERE = """
import os
from nbckpt.engine import AsyncCheckpointer
mine = AsyncCheckpointer()  # no root: the cluster's --dir
told = (os.environ["NBCKPT_DIR"], CKPT_DIR, str(mine.root))
mine.save(100, {"x": np.arange(4) + jax.process_index()})
mine.wait_until_finished()
mine.close()
"""


def test_engines_save_to_the_clusters_dir_without_being_told(ip, cluster, capsys):
    # The review's loop wrote twelve saves to './{CKPT}', and %ckpt_watch saw none.
    magics, root = cluster["magics"], cluster["root"]
    ip.run_cell_magic("px", "", TRAIN_HERE)
    assert _engines(magics, "told") == [(str(root),) * 3] * 2
    ip.run_line_magic("ckpt_ls", "")
    assert re.search(r"^\s+100\s+complete", capsys.readouterr().out, re.M)


def test_a_checkpointer_without_a_root_says_where_to_set_one(monkeypatch):
    from nbckpt.engine import AsyncCheckpointer
    from nbckpt.errors import NoRootError

    monkeypatch.delenv("NBCKPT_DIR", raising=False)
    with pytest.raises(NoRootError, match=r"start --dir D, which sets NBCKPT_DIR"):
        AsyncCheckpointer()


def test_stop_interrupts_a_running_loop_first(ip, cluster):
    # The review: a stop with a --noblock task running took 18.5 s; its request to
    # leave the job waited behind the loop, and busy engines died slowly.
    engines = cluster["magics"].cluster
    loop = ip.run_cell_magic("px", "--noblock", "import time\nwhile True: time.sleep(0.1)")
    deadline = time.monotonic() + 30  # until the controller has queued it on both
    while engines.busy() != [0, 1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engines.busy() == [0, 1]
    assert engines.interrupt_busy(wait_s=30) == [0, 1]
    assert loop.ready() and engines.busy() == []
    with pytest.raises(ipp.error.CompositeError, match="KeyboardInterrupt"):
        loop.get()


def test_stop_then_magics_say_how_to_start(ip, cluster, capsys):
    ip.run_line_magic("ckpt_cluster", "stop")
    assert "cluster stopped in" in capsys.readouterr().out
    with pytest.raises(UsageError, match="%ckpt_cluster start"):
        ip.run_line_magic("ckpt_status", "")
