"""The lab's registry: the record a cluster writes is the one type the server reads."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest

from nbckpt.server import roots
from nbckpt.session import registry
from nbckpt.session.cluster import JaxCluster, clusters_dir
from nbckpt.session.registry import ClusterRecord


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtime"
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(folder))
    return folder


def test_the_record_a_cluster_writes_is_the_record_the_server_reads(runtime: Path) -> None:
    assert roots.ClusterRecord is ClusterRecord  # one type, re-exported by the server
    cluster = JaxCluster(cluster_id="c/1", profile="p")
    path = cluster.register_root("/data/ckpt")
    assert path is not None and path.parent == clusters_dir()
    assert clusters_dir().is_relative_to(runtime)

    [read] = roots.running_clusters()
    assert type(read) is ClusterRecord
    assert (read.root, read.pid, read.profile, read.cluster_id, read.host) == (
        "/data/ckpt",
        os.getpid(),
        "p",
        "c/1",
        socket.gethostname(),
    )
    # The file holds exactly the record's fields, and parses back to the same record.
    assert ClusterRecord.from_json(path.read_text()) == read
    assert set(json.loads(path.read_text())) == {f.name for f in dataclasses.fields(ClusterRecord)}

    cluster.unregister_root()
    assert not path.exists() and roots.running_clusters() == []


def test_a_new_root_replaces_the_clusters_record(runtime: Path) -> None:
    cluster = JaxCluster(cluster_id="c1")
    cluster.register_root("/a")
    cluster.register_root("/b")
    assert [r.root for r in roots.running_clusters()] == ["/b"]
    cluster.register_root(None)  # registers nothing, and removes the old record
    assert roots.running_clusters() == []


def test_records_of_other_machines_and_of_dead_kernels_are_not_offered(tmp_path: Path) -> None:
    mine = ClusterRecord.now("/mine", profile=None, cluster_id="a")
    elsewhere = dataclasses.replace(mine, host="another-host", cluster_id="b")
    gone = dataclasses.replace(mine, pid=2**22 + 12345, cluster_id="c")
    for record in (mine, elsewhere, gone):
        assert registry.write_record(record, tmp_path) is not None
    (tmp_path / "half.json").write_text('{"root": "/x", ')
    assert roots.running_clusters(tmp_path) == [mine]
