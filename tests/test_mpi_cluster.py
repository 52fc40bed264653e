"""``%ckpt_cluster start --engines mpi``: engines started by Open MPI's ``mpiexec``.

Debian's Open MPI (``make test`` installs ``openmpi-bin``) starts the engines on this
machine through ipyparallel's MPI launcher; each takes its engine id from its MPI rank
(mpi4py) and joins ``jax.distributed`` as nbckpt's local engines do. CI runs as root,
which ``mpiexec`` refuses unless told twice; three engines on two cores need
oversubscription. A user meets both, so both refusals are tested as one clear line.
"""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

from nbckpt.errors import ClusterError
from nbckpt.formats.layout import all_steps
from nbckpt.session.cluster import JaxCluster
from tests.cluster_snippets import BUILD, CHECK

pytestmark = pytest.mark.multihost

# `make test` installs openmpi-bin; elsewhere the reason comes with the skip.
if shutil.which("mpiexec") is None:  # pragma: no cover
    pytest.skip("mpiexec is not installed (make host-deps installs it)", allow_module_level=True)

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _mpiexec_running() -> list[int]:
    return [
        p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("mpiexec", "orterun")
    ]


def test_mpi_start_save_then_restore_on_three(ip, tmp_path, capsys, monkeypatch):
    for key, value in ROOT_OK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")  # 3 engines on 2 cores
    magics = ip.magics_manager.registry["NbckptMagics"]
    root = tmp_path / "ckpt"
    try:
        ip.run_line_magic("ckpt_cluster", f"start --engines mpi -n 2 --dir {root}")
        assert "2 JAX processes ready" in capsys.readouterr().out
        cluster = magics.cluster
        assert _mpiexec_running(), "the engines were not started by mpiexec"
        ip.run_cell_magic("px", "", BUILD)
        # Ranks became engine ids, and engine ids JAX process indices: the collective
        # meets every process.
        assert cluster.view.pull("gathered", block=True) == [[0, 1]] * 2
        ip.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        assert all_steps(str(root)) == [1]
        ip.run_line_magic("ckpt_cluster", "stop")
        assert magics.cluster is None and not _mpiexec_running()

        ip.run_line_magic("ckpt_cluster", f"start --engines mpi -n 3 --dir {root}")
        ip.run_line_magic("ckpt_restore", "restored --step 1")
        assert "restored step 1 into 'restored' on 3 processes" in capsys.readouterr().out
        ip.run_cell_magic("px", "", CHECK)
        assert magics.cluster.view.pull("ok", block=True) == [True] * 3
    finally:
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None
    assert not _mpiexec_running()


def test_mpiexec_refusals_are_one_line_each(monkeypatch):
    monkeypatch.delenv("OMPI_MCA_rmaps_base_oversubscribe", raising=False)
    if os.geteuid() == 0:
        for key in ROOT_OK:
            monkeypatch.delenv(key, raising=False)
        with pytest.raises(ClusterError) as info:
            JaxCluster(n=1, engines="mpi").start(timeout_s=60)
        text = str(info.value)
        assert "mpiexec exited before the engines registered" in text, text
        assert "refuses to run as root" in text and "OMPI_ALLOW_RUN_AS_ROOT=1" in text, text
        for key, value in ROOT_OK.items():
            monkeypatch.setenv(key, value)
    # More engines than this machine's cores, with no hostfile: mpiexec has no slots.
    too_many = (os.cpu_count() or 1) + 1
    cluster = JaxCluster(n=too_many, engines="mpi")
    with pytest.raises(ClusterError) as info:
        cluster.start(timeout_s=60)
    text = str(info.value)
    assert "fewer slots" in text and "OMPI_MCA_rmaps_base_oversubscribe=1" in text, text
    assert "\n" not in text and cluster.cluster is None
    assert not _mpiexec_running()
