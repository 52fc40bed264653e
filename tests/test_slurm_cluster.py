"""``%ckpt_cluster start --engines slurm`` on a real Slurm cluster of test hosts.

:class:`~tests.slurmhosts.SlurmHosts` runs Debian's ``slurmctld`` on h0 and a
``slurmd`` on each other host (network namespaces with their own addresses and names),
one CPU each, so a job of n tasks spans n hosts. The notebook's kernel is this test
process, on the hosts' network as its gateway: ipyparallel's Slurm launcher submits the
engines with ``sbatch`` (one job, an ``srun`` engine per task) and they register with
the controller here, then join ``jax.distributed`` across the hosts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nbckpt.errors import SaveFailedError
from nbckpt.formats.layout import all_steps
from tests.cluster_snippets import BUILD, CHECK
from tests.slurmhosts import SlurmHosts
from tests.slurmhosts import unavailable as no_slurm
from tests.testhosts import TestHosts, unavailable

pytestmark = pytest.mark.multihost

# CI runs as root and `make test` installs slurm-wlm and munge; elsewhere, the reason.
if unavailable() or no_slurm():  # pragma: no cover
    pytest.skip(
        f"Slurm test hosts cannot run here: {unavailable() or no_slurm()}",
        allow_module_level=True,
    )


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    with TestHosts(4, gateway=True) as hosts, SlurmHosts(hosts, tmp_path / "slurm") as cluster:
        for key, value in cluster.env.items():
            monkeypatch.setenv(key, value)
        yield hosts, cluster


def _gone(slurm: SlurmHosts, timeout_s: float = 30.0) -> bool:
    """Whether Slurm holds no job (a cancelled job lingers while it completes)."""
    deadline = time.monotonic() + timeout_s
    while slurm.jobs():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def test_slurm_start_save_stop_then_restore_on_another_count(ip, slurm, tmp_path, capsys):
    hosts, cluster = slurm
    root = tmp_path / "ckpt"
    magics = ip.magics_manager.registry["NbckptMagics"]
    start = f"start --engines slurm --controller-ip {hosts.gateway} --dir {root}"
    try:
        ip.run_line_magic("ckpt_cluster", f"{start} -n 3")
        assert "3 JAX processes ready" in capsys.readouterr().out
        assert len(cluster.jobs()) == 1  # one allocation, sbatch'ed
        ip.run_cell_magic("px", "", BUILD)
        view = magics.cluster.view
        # One engine on each compute node, and the collective crosses them.
        assert sorted(view.pull("where", block=True)) == ["h1", "h2", "h3"]
        assert view.pull("gathered", block=True) == [[0, 1, 2]] * 3
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        assert all_steps(str(root)) == [1]
        ip.run_line_magic("ckpt_cluster", "stop")
        # stop releases the allocation: Slurm holds no job, the nodes are free again.
        assert magics.cluster is None and _gone(cluster), cluster.run("squeue")

        ip.run_line_magic("ckpt_cluster", f"{start} -n 2")
        ip.run_line_magic("ckpt_restore", "restored --step 1")
        assert "restored step 1 into 'restored' on 2 processes" in capsys.readouterr().out
        ip.run_cell_magic("px", "", CHECK)
        assert magics.cluster.view.pull("ok", block=True) == [True, True]
    finally:
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None
    assert _gone(cluster), cluster.run("squeue")


def test_a_node_lost_mid_save_is_named_with_its_slurm_job(ip, slurm, tmp_path, capsys):
    hosts, cluster = slurm
    root = tmp_path / "ckpt"
    magics = ip.magics_manager.registry["NbckptMagics"]
    start = f"start --engines slurm --controller-ip {hosts.gateway} --dir {root} -n 3"
    try:
        ip.run_line_magic("ckpt_cluster", start)
        [job] = cluster.jobs()
        assert f"in Slurm job {job} " in capsys.readouterr().out
        ip.run_cell_magic("px", "", BUILD)
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        where = magics.cluster.view.pull("where", block=True)
        # The last JAX process (not process 0, whose coordination service the job
        # needs to say anything) holds the save at its write; then its node goes,
        # slurmd and all. Slurm placed the processes on the nodes in its own order.
        victim = len(where) - 1
        node = where[victim]
        ip.run_line_magic("ckpt_fault", f"stall --process {victim} --at write --seconds 60")
        handle = ip.run_line_magic("ckpt_save", "state --step 2 --quiet")
        time.sleep(2)
        hosts.kill(int(node.removeprefix("h")))
        with pytest.raises(SaveFailedError) as info:
            handle.wait(timeout_s=120)
        text = str(info.value)
        assert f"process {victim} died on host {node}" in text, text
        assert f"(the engines run in Slurm job {job})" in text, text
        assert all_steps(str(root)) == [1]
        ip.run_line_magic("ckpt_cluster", "stop")
        # Slurm let go of the job: cancelled, its lost node's part given up with it.
        assert _gone(cluster, timeout_s=60), cluster.run("squeue")
    finally:
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None


def test_engines_srun_inside_an_allocation_then_attach(ip, slurm, tmp_path, capsys):
    """docs/guides/multihost.md's recipe: ipcontroller, salloc + srun ipengine, then attach."""
    hosts, cluster = slurm
    root = tmp_path / "ckpt"
    profile = f"nbckpt-slurm-{uuid.uuid4().hex[:8]}"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **cluster.env}
    magics = ip.magics_manager.registry["NbckptMagics"]
    controller = subprocess.Popen(
        [str(bin_dir / "ipcontroller"), f"--profile={profile}", f"--ip={hosts.gateway}",
         f"--location={hosts.gateway}", "--cluster-id=run1", "--HeartMonitor.period=500",
         "--log-level=ERROR"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    allocation = None
    try:
        engine_file = Path(profile_dir(profile)) / "security" / "ipcontroller-run1-engine.json"
        deadline = time.monotonic() + 30
        while not engine_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        # Two nodes, one engine each, in an allocation held by salloc.
        allocation = subprocess.Popen(
            ["salloc", "-N", "2", "--ntasks-per-node=1", "srun", str(bin_dir / "ipengine"),
             f"--profile={profile}", "--cluster-id=run1", "--log-level=ERROR"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        _registered(profile, "run1", 2)  # as a user attaches once the engines are up
        assert len(cluster.jobs()) == 1  # the allocation holding them
        ip.run_line_magic(
            "ckpt_cluster", f"attach --cluster-id run1 --profile {profile} --dir {root}"
        )
        assert "2 JAX processes ready" in capsys.readouterr().out
        ip.run_cell_magic("px", "", BUILD)
        assert sorted(magics.cluster.view.pull("where", block=True)) == ["h1", "h2"]
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        assert all_steps(str(root)) == [1]
        ip.run_line_magic("ckpt_cluster", "stop")
        # The engines stopped (srun reports their end as a failure: they were told to
        # stop), so srun returned and salloc gave the allocation back.
        allocation.wait(timeout=60)
        assert _gone(cluster), cluster.run("squeue")
        assert controller.poll() is None  # a controller you started keeps running
    finally:
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None
        # Each in a session of its own: its children (the hub's schedulers, srun) go too.
        for proc in (allocation, controller):
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(profile_dir(profile), ignore_errors=True)


def _registered(profile: str, cluster_id: str, n: int, timeout_s: float = 60.0) -> None:
    import ipyparallel as ipp

    client = ipp.Client(profile=profile, cluster_id=cluster_id)
    try:
        client.wait_for_engines(n, timeout=timeout_s)
    finally:
        client.close()


def profile_dir(name: str) -> str:
    """Where IPython keeps the profile ``name``."""
    from IPython.paths import get_ipython_dir

    return os.path.join(get_ipython_dir(), f"profile_{name}")
