"""How engines nbckpt starts find the controller: the connection file and the ssh config."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from nbckpt.cluster import JaxCluster, _await_url_file


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
    config = cluster._ssh_config()
    engines = config.SSHEngineSetLauncher.engines
    assert engines == {"h0": {"n": 2, "to_send": []}, "h1": {"n": 1, "to_send": []}}
