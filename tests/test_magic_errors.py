"""How nbckpt's errors show in a notebook: one line, with the traceback one ``%tb`` away.

A real IPython shell runs the cells; the cluster tests start real ipyparallel engines.
"""

from __future__ import annotations

import contextlib
import sys
import time

import psutil
import pytest

from nbckpt.errors import ClusterError, StepNotFoundError
from nbckpt.session.client import SaveHandle

STATE = "import numpy as np\nstate = {'w': np.arange(8.0), 'lr': 0.5}"


def _run(ip, cell, capsys):
    """Run ``cell`` as a notebook would; return what it printed to stdout and stderr."""
    capsys.readouterr()
    ip.run_cell(cell)
    captured = capsys.readouterr()
    return captured.out, captured.err


def _lines(text):
    return [ln for ln in text.splitlines() if ln.strip()]


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_an_nbckpt_error_is_one_line_and_tb_shows_its_traceback(ip, capsys):
    out, err = _run(ip, "import nbckpt\nraise nbckpt.StepNotFoundError('/r', 99, [1, 2])", capsys)
    assert _lines(err) == [
        "StepNotFoundError: no complete step 99 in /r; complete steps there: 1, 2"
    ]
    assert "Traceback" not in out + err
    assert isinstance(sys.last_value, StepNotFoundError) and sys.last_value.existing == [1, 2]
    out, _err = _run(ip, "%tb", capsys)
    assert "Traceback" in out and "StepNotFoundError" in out
    # Other errors keep IPython's traceback.
    out, err = _run(ip, "raise KeyError('plain')", capsys)
    assert "Traceback" in out + err


@pytest.mark.parametrize("bad", ["s3:bucket/x", "{tmp}/a-file/ckpt", "ftp://host/x"])
def test_a_bad_root_starts_no_process(ip, capsys, tmp_path, bad):
    magics = ip.magics_manager.registry["NbckptMagics"]
    assert magics.cluster is None
    (tmp_path / "a-file").write_text("not a directory")
    before = _children()
    try:
        _out, err = _run(ip, f"%ckpt_cluster start -n 2 --dir {bad.format(tmp=tmp_path)}", capsys)
        assert len(_lines(err)) == 1 and err.startswith("UsageError: "), err
        assert "no cluster was started" in err
        assert _children() <= before
        assert magics.cluster is None
    finally:  # on failure, leave no engine behind for the next test
        if magics.cluster is not None:
            magics.cluster.stop()
            magics.cluster = magics.client = None
        for pid in _children() - before:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.fixture(scope="module")
def cluster(ip, tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    ip.run_line_magic("ckpt_cluster", f"start -n 2 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    ip.run_cell_magic("px", "", STATE)
    yield {"root": root, "magics": magics}
    if magics.cluster is not None:
        magics.cluster.stop()
        magics.cluster = magics.client = None


def test_an_engine_error_through_a_magic_is_one_line(ip, cluster, capsys):
    out, err = _run(ip, "%ckpt_restore state --step 99", capsys)
    assert len(_lines(err)) == 1, err
    assert err.startswith("ClusterError: restore of 'state' failed on processes 0, 1: ")
    assert "no complete step 99" in err and "Traceback" not in out + err
    # The per-process causes are data on the exception, and %tb shows where it came from.
    error = sys.last_value
    assert isinstance(error, ClusterError) and error.processes == [0, 1]
    assert sorted(error.causes) == [0, 1]
    assert all(c.startswith("StepNotFoundError: ") for c in error.causes.values())
    out, _err = _run(ip, "%tb", capsys)
    assert "Traceback" in out and "ClusterError" in out


def test_save_wait_returns_the_handle(ip, cluster, capsys):
    out, err = _run(ip, "h = %ckpt_save state --step 1 --wait --quiet", capsys)
    assert "h" in ip.user_ns, out + err
    handle = ip.user_ns["h"]
    assert isinstance(handle, SaveHandle) and handle.status() == "committed"
    _out, err = _run(ip, "%ckpt_save state --step 1 --quiet", capsys)
    assert len(_lines(err)) == 1 and "StepExistsError: step already committed" in err


def test_px_and_status_after_an_engine_died_say_which_and_how_to_go_on(ip, cluster, capsys):
    magics = cluster["magics"]
    ip.run_line_magic("ckpt_fault", "kill --process 1")
    deadline = time.monotonic() + 30
    while magics.cluster.dead_processes() != [1] and time.monotonic() < deadline:
        time.sleep(0.2)
    for cell in ("%px x = 1", "%%px\nx = 1"):
        out, err = _run(ip, cell, capsys)
        assert _lines(err) == [
            "ClusterError: process 1 died; the others are alive but a JAX job cannot take "
            "a process back: run %ckpt_cluster restart, then %ckpt_restore VAR"
        ], out + err
        assert "KeyError" not in out + err
    out, err = _run(ip, "%ckpt_status", capsys)
    assert "process 1 dead" in out and "%ckpt_cluster restart" in out, out + err
    out, err = _run(ip, "%ckpt_cluster status", capsys)
    assert _lines(err) and _lines(err)[0].startswith("ClusterError: process 1 died"), out + err
