"""The heartbeat monitor's verdicts, over the in-process client and real sockets.

Process 1 is played by the test: it beats once and then falls silent, with a real
listening socket (it lives: load, or hung) or a closed port (it died). Its dials go to
127.0.0.1 only. tests/test_netfaults.py runs the same verdicts across test hosts.
"""

import json
import socket
import time

import pytest

from nbckpt.engine.sync import health
from nbckpt.engine.sync.barriers import InProcessClient
from nbckpt.errors import PeerDeadError


@pytest.fixture
def silent_peer():
    """A monitor of process 0 of 2, and a way to publish process 1's port."""
    store = InProcessClient(0, 2)
    peer = InProcessClient(1, 2, store=store)
    peer.key_value_set("nbckpt/health/1", "1")
    monitor = health.HealthMonitor(
        InProcessClient(0, 2, store=store), interval_s=0.05, dead_after_s=0.3, address="127.0.0.1"
    )

    def publish(port):
        peer.key_value_set("nbckpt/hosts/1", json.dumps(["peerhost", "127.0.0.1", port]))

    yield monitor, publish
    monitor.stop()


def _silent_past(monitor, process, seconds):
    while monitor.silent_for(process) <= seconds:
        time.sleep(0.05)


def test_a_silent_peer_that_accepts_connections_is_slow_until_the_hung_bound(
    silent_peer, monkeypatch
):
    monitor, publish = silent_peer
    with socket.create_server(("127.0.0.1", 0)) as alive:
        publish(alive.getsockname()[1])
        monkeypatch.setattr(health, "HUNG_AFTER_S", 1.0)
        _silent_past(monitor, 1, 0.5)
        assert monitor.view()[1] == "dead"  # past dead_after_s by its heartbeat alone
        monitor.check("barrier b")  # but it answers the dial: load, not a loss
        _silent_past(monitor, 1, 1.0)
        with pytest.raises(PeerDeadError) as caught:
            monitor.check("barrier b")
    msg = str(caught.value)
    assert "process 1 became unreachable on host peerhost at 127.0.0.1" in msg, msg
    assert "though it still accepts connections" in msg, msg


def test_a_silent_peer_whose_port_is_closed_died(silent_peer):
    monitor, publish = silent_peer
    with socket.create_server(("127.0.0.1", 0)) as gone:
        port = gone.getsockname()[1]
    publish(port)  # closed now: the host answers that nothing listens there
    _silent_past(monitor, 1, 0.5)
    with pytest.raises(PeerDeadError) as caught:
        monitor.check("barrier b")
    msg = str(caught.value)
    assert "process 1 died on host peerhost at 127.0.0.1" in msg, msg
    assert "its host answers that it is gone" in msg, msg
