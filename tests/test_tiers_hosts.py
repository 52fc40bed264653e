"""A host is what shares a local directory (issue 28): its id, and where replicas go."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nbckpt.engine.tiers.hosts import HOST_ID_FILE, host_id, replica_hosts
from nbckpt.procgroup import ProcessGroup


def test_one_directory_is_one_host_and_a_wiped_one_is_a_new_host(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    first = host_id(a)
    assert host_id(a) == first and host_id(str(a)) == first
    assert host_id(b) != first
    (a / HOST_ID_FILE).unlink()  # a replaced machine, or a wiped /dev/shm
    assert host_id(a) != first
    assert sorted(p.name for p in a.iterdir()) == [HOST_ID_FILE]  # no leftovers


def test_processes_that_start_together_on_one_host_agree_on_its_id(tmp_path: Path) -> None:
    for trial in range(10):
        folder = tmp_path / str(trial)
        ids: list[str] = []
        go = threading.Barrier(8)

        def start(folder: Path, go: threading.Barrier, ids: list[str]) -> None:
            go.wait()
            ids.append(host_id(folder))

        threads = [threading.Thread(target=start, args=(folder, go, ids)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 8 and len(set(ids)) == 1, ids
        assert [p.name for p in folder.iterdir()] == [HOST_ID_FILE]


def test_a_file_nbckpt_did_not_write_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / HOST_ID_FILE).write_text("not an id")
    with pytest.raises(ValueError, match="does not hold a host id"):
        host_id(tmp_path)


def test_replicas_go_to_the_next_hosts_around_the_ring_never_home() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "d"}
    assert replica_hosts(hosts, "a", 1) == ["b"]
    assert replica_hosts(hosts, "d", 2) == ["a", "b"]
    assert replica_hosts(hosts, "c", 9) == ["d", "a", "b"]  # only three others exist
    assert replica_hosts({0: "a", 1: "a"}, "a", 1) == []  # one host: nowhere else
    assert replica_hosts(hosts, "b", 0) == []
    with pytest.raises(ValueError, match="not one of this job's hosts"):
        replica_hosts(hosts, "z", 1)
    with pytest.raises(ValueError, match="replicas must be 0 or more"):
        replica_hosts(hosts, "a", -1)


@pytest.mark.multihost
def test_four_processes_on_two_local_directories_are_two_hosts(tmp_path: Path) -> None:
    dirs = [str(tmp_path / name) for name in ("left", "left", "right", "right")]
    with ProcessGroup(4) as group:
        views = group.run("tests.mh_tiers:hosts", dirs, 1)
    hosts = views[0]["hosts"]
    assert all(v["hosts"] == hosts for v in views)  # every process sees the same hosts
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    assert hosts[0] == host_id(tmp_path / "left")
    assert [v["replicas"] for v in views] == [[hosts[2]]] * 2 + [[hosts[0]]] * 2
