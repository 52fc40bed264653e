"""The local tier on test hosts that each have their own ``/dev/shm`` (issue 28).

Every process uses the same local directory, ``/dev/shm/nbckpt-tier``, but each test
host has its own memory there (a tmpfs in a mount namespace held for the host's
lifetime), and the peers reach each other only over the hosts' network. A lost host is
replaced by a machine with the same name and address and an empty ``/dev/shm``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbckpt.formats.layout import all_steps
from nbckpt.procgroup import ProcessGroup
from tests.conftest import _ENV
from tests.testhosts import TestHosts, unavailable

pytestmark = pytest.mark.multihost
T = "tests.mh_local_tier"
LOCAL = "/dev/shm/nbckpt-tier"

# CI runs as root, so this runs there; elsewhere the reason is printed with the skip.
if unavailable() is not None:  # pragma: no cover
    pytest.skip(f"test hosts cannot be made here: {unavailable()}", allow_module_level=True)


@pytest.fixture
def hosts() -> Iterator[TestHosts]:
    with TestHosts(4, shm=True) as made:
        yield made


def _job(hosts: TestHosts, fn: str, *args: Any, **kw: Any) -> list[Any]:
    """Run ``fn`` in a fresh job of one process per host, its coordinator on host 0."""
    with ProcessGroup(
        4,
        env=_ENV,
        launcher=hosts.launcher([0, 1, 2, 3]),
        coordinator_host=hosts.hosts[0].address,
        start_timeout_s=60,
    ) as group:
        return group.run(f"{T}:{fn}", *args, kwargs=kw, timeout_s=240)


def test_a_replaced_host_gets_its_shards_back_from_its_neighbour(
    hosts: TestHosts, tmp_path: Path
) -> None:
    root = str(tmp_path / "root")
    _job(hosts, "save", root, [LOCAL] * 4, [0, 1, 2, 3], persistent_every=2)
    assert all_steps(root) == [0, 2]
    hosts.replace(2)  # host 2 is lost; a new machine takes its name and address

    results = _job(hosts, "restore", root, [LOCAL] * 4)
    assert [r["step"] for r in results] == [3] * 4  # the newest step, local only
    assert all(r["same"] for r in results)
    fetched = [e for e in results[2]["events"] if e["event"] == "fetched"]
    # Its own unit, and from every other pack its chunks of the small (packed) leaves.
    assert {p for e in fetched for p in e["processes"]} == {0, 1, 2, 3}
    # Straight from the peers, over the hosts' own network.
    subnet = hosts.subnet
    assert all(ipaddress.ip_address(e["peer"].rsplit(":", 1)[0]) in subnet for e in fetched)
    # Process 2's own shards came from host 3, which kept host 2's replica.
    assert any(e["peer"].startswith(f"{hosts.hosts[3].address}:") for e in fetched)


def test_two_adjacent_hosts_replaced_fall_back_to_the_persistent_step(
    hosts: TestHosts, tmp_path: Path
) -> None:
    root = str(tmp_path / "root")
    _job(hosts, "save", root, [LOCAL] * 4, [0, 1, 2, 3], persistent_every=2)
    hosts.replace(1)
    hosts.replace(2)

    results = _job(hosts, "restore", root, [LOCAL] * 4)
    assert [r["step"] for r in results] == [2] * 4
    assert all(r["same"] for r in results)
    chosen = next(e for e in results[0]["events"] if e["event"] == "tier_chosen")
    assert chosen["tier"] == "persistent"
