"""Test hosts (network namespaces on this machine) and a JAX job spread over them.

Each host has its own address on a private bridge, its own host name and its own
``/etc/hosts``; processes started there reach each other only through those addresses.
The JAX job's coordination service listens on host 0's address. The checkpoint root is
a directory all hosts see (the hosts share this machine's file systems).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from nbckpt.formats.layout import all_steps
from nbckpt.procgroup import ProcessGroup
from tests.conftest import _ENV
from tests.testhosts import NETNS_ETC, TestHosts, unavailable

pytestmark = pytest.mark.multihost
T = "tests.mh_hosts"

# CI runs as root, so this runs there; elsewhere the reason is printed with the skip.
if unavailable() is not None:  # pragma: no cover
    pytest.skip(f"test hosts cannot be made here: {unavailable()}", allow_module_level=True)


def _on(hosts: TestHosts, i: int, script: str) -> str:
    out = subprocess.run(
        hosts.command(i, ["sh", "-c", script]), capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_hosts_have_their_own_names_addresses_and_hosts_files():
    with TestHosts(3) as hosts:
        made = [h.netns for h in hosts.hosts]
        for h in hosts.hosts:
            assert _on(hosts, h.index, "hostname") == h.name
            assert h.address in _on(hosts, h.index, "ip -4 -o addr")
            assert _on(hosts, h.index, "getent hosts h2").split()[0] == hosts.hosts[2].address
            # Nothing of this machine's own network is there: only the bridge's subnet.
            assert "127.0.0.1" not in _on(hosts, h.index, "getent hosts h0")
        bridge = hosts.bridge
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in made)
    assert not any((NETNS_ETC / ns).exists() for ns in made)
    gone = subprocess.run(["ip", "link", "show", bridge], capture_output=True)
    assert gone.returncode != 0


def test_default_debian_hosts_file_maps_the_own_name_to_loopback():
    with TestHosts(2, loopback_names=True) as hosts:
        assert _on(hosts, 0, "getent hosts h0").split()[0] == "127.0.1.1"
        assert _on(hosts, 0, "getent hosts h1").split()[0] == hosts.hosts[1].address


def test_save_on_3_hosts_restore_on_2(tmp_path):
    root = str(tmp_path / "ckpt")
    with TestHosts(3) as hosts:
        with ProcessGroup(
            3,
            env=_ENV,
            launcher=hosts.launcher([0, 1, 2]),
            coordinator_host=hosts.hosts[0].address,
        ) as group:
            saved = group.run(f"{T}:save", root, 1)
            assert [s["host"] for s in saved] == ["h0", "h1", "h2"]
        assert all_steps(root) == [1]
        # Another job, on two of the hosts, with its coordinator on host 1.
        with ProcessGroup(
            2,
            env=_ENV,
            launcher=hosts.launcher([1, 2]),
            coordinator_host=hosts.hosts[1].address,
        ) as group:
            assert group.run(f"{T}:restore_check", root, 1) == [True, True]
    assert os.path.isdir(root)


def test_a_host_name_mapped_to_loopback_still_runs_cross_host_collectives():
    # Debian's default /etc/hosts: each host's own name is 127.0.1.1. JAX's gloo
    # collectives would advertise that address; nbckpt binds them to the address that
    # reaches the coordinator instead, and a collective across the hosts completes.
    with (
        TestHosts(2, loopback_names=True) as hosts,
        ProcessGroup(
            2,
            env=_ENV,
            launcher=hosts.launcher([0, 1]),
            coordinator_host=hosts.hosts[0].address,
            start_timeout_s=60,
        ) as group,
    ):
        assert group.run(f"{T}:allgather", timeout_s=60) == [[0, 1], [0, 1]]


def test_loopback_detection_leaves_single_host_jobs_alone():
    from nbckpt.engine.sync.process import loopback_name, route_address

    assert loopback_name("127.0.0.1:1234") is None  # the whole job is on this host
    assert route_address("127.0.0.1:1234") == "127.0.0.1"
