"""The cluster keeps its options in one ClusterOptions; the seams around it stay put."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from nbckpt.session import bootstrap, options, rpc
from nbckpt.session.cluster import LAUNCHERS, JaxCluster, remote
from nbckpt.session.options import ClusterOptions


def test_every_option_reads_through_the_cluster() -> None:
    given = ClusterOptions(
        n=2,
        devices_per_process=3,
        coordinator_host="10.0.0.1",
        recoverable=False,
        profile="p",
        engines="ssh",
        hosts=["h0", "h1"],
        controller_ip="10.0.0.9",
        ssh_config="/cfg",
        python="/py",
    )
    cluster = JaxCluster(options=given)
    assert cluster.options is given
    for f in dataclasses.fields(ClusterOptions):
        assert getattr(cluster, f.name) == getattr(given, f.name), f.name
    assert given.hosts == ("h0", "h1")  # a list is kept as a tuple


def test_keywords_build_the_same_options_as_before() -> None:
    cluster = JaxCluster(n=2, devices_per_process=2, engines="ssh", hosts=["a", "b"])
    assert cluster.options == ClusterOptions(
        n=2, devices_per_process=2, engines="ssh", hosts=("a", "b")
    )
    # Keywords go over the options given; an unknown one is refused.
    assert JaxCluster(options=cluster.options, n=5).options.hosts == ("a", "b")
    assert JaxCluster(options=cluster.options, n=5).n == 5
    with pytest.raises(TypeError):
        JaxCluster(workers=3)
    # Setting an option replaces the options, as setting a field did.
    cluster.python = "/v/py"
    assert cluster.options.python == "/v/py"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"engines": "pbs"}, "engines must be one of"),
        ({"engines": "ssh"}, "needs hosts"),
        ({"engines": "ssh", "hosts": ["h0"], "n": 2}, "n=2 but 1 hosts"),
        ({"hosts": ["h0"]}, "hosts are for engines='ssh'"),
        ({"n": 0}, "at least one engine"),
    ],
)
def test_options_that_do_not_go_together_are_refused_before_a_start(kwargs, message) -> None:
    cluster = JaxCluster(**kwargs)  # built: the check is the start's
    with pytest.raises(ValueError, match=message):
        cluster.start(timeout_s=1)
    assert cluster.cluster is None and cluster.client is None


def test_the_moved_names_are_the_same_objects_at_the_old_path() -> None:
    assert LAUNCHERS is options.LAUNCHERS
    assert remote("m:f").func is rpc.call  # what ipyparallel pickles, by its module
    import nbckpt.session.cluster as old

    assert old.engine_main is bootstrap.engine_main
    assert old.preload_report is bootstrap.preload_report
    assert old.ENGINE_MAIN == bootstrap.ENGINE_MAIN


def test_what_engines_import_by_name_needs_neither_jax_nor_ipython() -> None:
    # The engines import these modules for engine_main, the probe and rpc.call.
    code = (
        "import sys, nbckpt.session.bootstrap, nbckpt.session.rpc\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert not {"jax", "tensorstore", "IPython", "ipyparallel"} & set(out.split())
