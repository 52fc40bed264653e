"""``%ckpt_cluster start --engines ssh`` on test hosts that each run a real sshd.

The notebook's kernel is this test process, on this machine, which joins the hosts'
network as its gateway; the engines start on the hosts through ipyparallel's ssh
launcher, with the keys and ssh config the fixture made. The hosts keep Debian's
default ``/etc/hosts`` (their own name maps to 127.0.1.1), so the save also shows that
cross-host collectives pick the address that reaches the other hosts.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from nbckpt.errors import ClusterError
from nbckpt.formats.layout import all_steps
from nbckpt.session.client import SaveFailedError
from nbckpt.session.cluster import JaxCluster
from tests.cluster_snippets import BUILD, CHECK
from tests.sshhosts import HOST_STORAGE, SSHHosts
from tests.sshhosts import unavailable as no_sshd
from tests.testhosts import TestHosts, unavailable

pytestmark = pytest.mark.multihost

# CI runs as root and `make test` installs sshd; elsewhere the reason comes with the skip.
if unavailable() or no_sshd():  # pragma: no cover
    pytest.skip(
        f"ssh test hosts cannot run here: {unavailable() or no_sshd()}", allow_module_level=True
    )


def _magics(ip):
    return ip.magics_manager.registry["NbckptMagics"]


def _engines(cluster, name):
    return cluster.view.pull(name, block=True)


def _listening(pid: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.fixture
def hosts(tmp_path):
    with (
        TestHosts(3, gateway=True, loopback_names=True) as made,
        SSHHosts(made, tmp_path / "ssh") as ssh,
    ):
        yield made, ssh


def test_ssh_start_on_three_hosts_save_then_restore_on_two(ip, hosts, tmp_path, capsys):
    made, ssh = hosts
    root = tmp_path / "ckpt"
    magics = _magics(ip)
    start = f"start --engines ssh --ssh-config {ssh.config} --dir {root} --hosts"
    try:
        ip.run_line_magic("ckpt_cluster", f"{start} h0,h1,h2")
        out = capsys.readouterr().out
        cluster = magics.cluster
        assert "3 JAX processes ready" in out and " on h0, h1, h2 " in out
        assert f"cluster id {cluster.cluster_id}" in out
        assert cluster.engine_hosts == ["h0", "h1", "h2"]
        # The engines ssh started imported jax while they started, before the join.
        early = cluster.apply("nbckpt.session.cluster:preload_report", what="preload report")
        assert all(r.get("jax_before") is False and r.get("jax_at_join") for r in early), early
        # The controller listens where the hosts reach it, and only there; process 0's
        # coordination service binds host 0's address, not every interface.
        assert cluster.controller_ip == made.gateway
        assert _listening(cluster.cluster.controller.process.pid) == {made.gateway}
        address, port = cluster.coordinator.rsplit(":", 1)
        assert address == made.hosts[0].address
        sockets = subprocess.run(
            ["ip", "netns", "exec", made.hosts[0].netns, "ss", "-ltnH"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        bound = {
            local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
            for local in (line.split()[3] for line in sockets.splitlines())
            if local.endswith(f":{port}")
        }
        assert bound == {address}

        ip.run_cell_magic("px", "", BUILD)
        # Host names map to 127.0.1.1 on each host, yet the collective crosses hosts.
        assert _engines(cluster, "gathered") == [[0, 1, 2]] * 3
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        assert all_steps(str(root)) == [1]
        ip.run_line_magic("ckpt_cluster", "stop")
        assert magics.cluster is None

        # A new job on two of the hosts, process 0 on h1, restores what three wrote.
        ip.run_line_magic("ckpt_cluster", f"{start} h1,h2")
        cluster = magics.cluster
        assert cluster.engine_hosts == ["h1", "h2"]
        assert cluster.coordinator.startswith(made.hosts[1].address + ":")
        ip.run_line_magic("ckpt_restore", "restored --step 1")
        assert "restored step 1 into 'restored' on 2 processes" in capsys.readouterr().out
        ip.run_cell_magic("px", "", CHECK)
        assert _engines(cluster, "ok") == [True, True]
        assert _engines(cluster, "where") == ["h1", "h2"]
    finally:
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None


def test_a_host_ssh_cannot_reach_is_named(hosts, tmp_path):
    _made, ssh = hosts
    cluster = JaxCluster(n=2, engines="ssh", hosts=["h0", "h7"], ssh_config=str(ssh.config))
    with pytest.raises(ClusterError, match=r"over ssh on h7: ssh failed: .*h7.*--ssh-config"):
        cluster.start(timeout_s=30)
    assert cluster.client is None and cluster.cluster is None


def test_a_python_without_nbckpt_on_the_hosts_is_named(hosts):
    _made, ssh = hosts
    cluster = JaxCluster(
        n=1, engines="ssh", hosts=["h1"], ssh_config=str(ssh.config), python="/usr/bin/python3"
    )
    with pytest.raises(
        ClusterError,
        match=r"on h1: /usr/bin/python3 cannot run nbckpt there: .*"
        r"No module named",
    ):
        cluster.start(timeout_s=30)
    assert cluster.cluster is None


def test_engines_that_never_register_are_reported_by_host(hosts):
    _made, ssh = hosts
    # The controller listens on loopback, which the hosts cannot reach: the engines
    # start but never register, and the error says which hosts were not heard from.
    cluster = JaxCluster(
        n=1, engines="ssh", hosts=["h2"], ssh_config=str(ssh.config), controller_ip="127.0.0.1"
    )
    with pytest.raises(ClusterError) as err:
        cluster.start(timeout_s=8)
    text = str(err.value)
    assert "only 0 of 1 engines registered within 8 s (none from h2)" in text, text
    assert "controller at 127.0.0.1 (--controller-ip)" in text
    assert cluster.client is None and cluster.cluster is None


def test_the_notebook_reads_what_only_the_hosts_see(ip, tmp_path, capsys):
    # Each host mounts the storage at /srv/ckpt; this machine has no /srv/ckpt at all.
    # Journals, listings, fsck and the timeline reach the notebook through the engines'
    # read services, which answer even while the engines run a cell.
    store = tmp_path / "store"
    store.mkdir()
    magics = _magics(ip)
    with (
        TestHosts(2, gateway=True) as made,
        SSHHosts(made, tmp_path / "ssh", storage=store) as ssh,
    ):
        assert not Path(HOST_STORAGE).exists()
        try:
            ip.run_line_magic(
                "ckpt_cluster",
                f"start --engines ssh --ssh-config {ssh.config} --dir {HOST_STORAGE} --hosts h0,h1",
            )
            cluster = magics.cluster
            assert cluster.reader.remote and cluster.relay is not None
            ip.run_cell_magic("px", "", BUILD)
            handle = ip.run_line_magic("ckpt_save", "state --step 1 --quiet")
            ip.run_line_magic("ckpt_wait", "")
            assert handle.status() == "committed"
            ip.run_line_magic("ckpt_save", "state --step 2 --wait --quiet")
            capsys.readouterr()

            ip.run_line_magic("ckpt_ls", "")
            listing = capsys.readouterr().out
            assert re.search(rf"^\s+1\s+complete\s+nbckpt\s+{HOST_STORAGE}/1", listing, re.M)
            assert re.search(r"^\s+2\s+complete", listing, re.M)
            ip.run_line_magic("ckpt_fsck", "")
            assert "complete" in capsys.readouterr().out
            ip.run_line_magic("ckpt_show", "")
            assert "committed" in capsys.readouterr().out
            ip.run_line_magic("ckpt_timeline", f"--save {tmp_path / 't.png'}")
            assert (tmp_path / "t.png").stat().st_size > 0

            # A failed save is explained from the hosts' view of the step.
            ip.run_line_magic("ckpt_fault", "fail-io --process 1")
            with pytest.raises(SaveFailedError, match="nothing was committed for this step"):
                ip.run_line_magic("ckpt_save", "state --step 3 --wait --quiet")
            ip.run_line_magic("ckpt_fault", "clear")

            # The read service answers while every engine is busy running a cell.
            busy = cluster.view.apply_async(time.sleep, 5)
            ops = cluster.reader.run("nbckpt.journal:list_operations", HOST_STORAGE)
            assert len(ops) >= 3 and not busy.ready()
            busy.get(timeout=30)

            # The checkpoint is on the hosts' storage, not on this machine's /srv.
            assert sorted(p.name for p in store.iterdir() if p.name.isdigit()) == ["1", "2"]
        finally:
            if magics.cluster is not None:
                magics.cluster.stop()
                magics.cluster = magics.client = None
        assert not cluster.reader.remote and cluster.relay is None
