"""How engines nbckpt starts find the controller: the connection file and the ssh config."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from nbckpt.errors import ClusterError
from nbckpt.session.arrivals import where_stuck as _where_stuck
from nbckpt.session.bootstrap import await_url_file as _await_url_file
from nbckpt.session.cluster import JaxCluster
from nbckpt.session.launch import SSHLauncher


def _profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "security").mkdir()
    monkeypatch.setenv("IPP_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("IPP_CLUSTER_ID", "c1")
    monkeypatch.delenv("IPP_CONNECTION_INFO", raising=False)
    return tmp_path / "security" / "ipcontroller-c1-engine.json"


def test_a_local_engine_waits_until_the_connection_file_parses(tmp_path, monkeypatch):
    path = _profile(tmp_path, monkeypatch)
    path.write_text('{"interface": "tcp://127.0.0.1", ')  # created, half written
    done = threading.Event()

    def finish() -> None:
        time.sleep(0.3)
        path.write_text(json.dumps({"interface": "tcp://127.0.0.1", "registration": 1}))
        done.set()

    writer = threading.Thread(target=finish)
    writer.start()
    _await_url_file(["--IPEngine.wait_for_url_file=30"])
    # It returned only once the whole file was there.
    assert done.is_set()
    json.loads(path.read_text())
    writer.join()


def test_the_wait_ends_at_the_engines_own_deadline(tmp_path, monkeypatch):
    path = _profile(tmp_path, monkeypatch)
    _await_url_file(["--IPEngine.wait_for_url_file=0.2"])  # no file: returns, engine reports
    assert not path.exists()


def test_an_engine_given_the_connection_info_reads_no_file(tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch)
    monkeypatch.setenv("IPP_CONNECTION_INFO", "{}")
    _await_url_file(["--IPEngine.wait_for_url_file=30"])  # returns at once, nothing to wait for


def test_ssh_engines_get_no_copies_of_the_connection_files():
    cluster = JaxCluster(n=3, engines="ssh", hosts=["h0", "h1", "h0"])
    config = SSHLauncher(cluster.options).config()
    engines = config.SSHEngineSetLauncher.engines
    assert engines == {"h0": {"n": 2, "to_send": []}, "h1": {"n": 1, "to_send": []}}


# -- engines that never register, started for real from a caller without an event loop --
# (ipyparallel hears of an exit on its loop, which runs here only during its own calls)


def _failed_start(monkeypatch: pytest.MonkeyPatch, code: str, n: int, timeout_s: float) -> str:
    """Start ``n`` engines that run ``code`` in place of engine_main; the error's text."""
    monkeypatch.setattr("nbckpt.session.cluster.ENGINE_MAIN", code)
    with pytest.raises(ClusterError) as info:
        JaxCluster(n=n).start(timeout_s=timeout_s)
    return str(info.value)


def test_an_engine_that_exits_before_it_registers_is_named_with_its_last_line(monkeypatch):
    boom = "import sys; print('starting', flush=True); sys.exit('boom: no jax here')"
    text = _failed_start(monkeypatch, boom, n=2, timeout_s=60)
    # Told as an exit, with what the engine said last, not as a wait that ran out.
    assert "exited before it registered: boom: no jax here" in text, text
    assert "registered within" not in text, text
    assert "the cluster was stopped" in text, text


def test_an_engine_alive_but_unregistered_is_asked_where_it_is(monkeypatch):
    # engine_main as the engines run it, but the engine itself never starts.
    hang = (
        "import ipyparallel.engine.app as app, time\n"
        "def main():\n"
        "    print('about to register', flush=True)\n"
        "    time.sleep(600)\n"
        "app.main = main\n"
        "from nbckpt.session.cluster import engine_main; engine_main()"
    )
    text = _failed_start(monkeypatch, hang, n=1, timeout_s=20)
    assert "only 0 of 1 engines registered within 20 s" in text, text
    # Its stacks, dumped on SIGUSR1, say where it stands.
    assert 'is running but never registered; it last logged "about to register"' in text, text
    assert 'is at File "<string>", line 4 in main' in text, text


def test_where_a_stuck_engine_stands_reads_a_faulthandler_dump():
    dump = (
        "2026-11-22 [IPEngine] Registering with controller at tcp://127.0.0.1:1\n"
        "Thread 0x00007f (most recent call first):\n"
        '  File "/x/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x00007e (most recent call first):\n"
        '  File "/x/zmq.py", line 10 in poll\n'
        '  File "/x/app.py", line 559 in register\n'
    )
    assert _where_stuck(dump) == (
        'is running but never registered; it last logged "2026-11-22 [IPEngine] '
        'Registering with controller at tcp://127.0.0.1:1", and is at '
        'File "/x/zmq.py", line 10 in poll'
    )
    assert _where_stuck("") == "is running but never registered; it logged nothing"
