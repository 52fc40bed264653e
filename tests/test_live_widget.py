"""Live views over a real 2-engine cluster, in a real IPython shell (as test_magics does)."""

from __future__ import annotations

import re
import threading
import time

import pytest
from IPython.core.error import UsageError
from matplotlib.figure import Figure

pytestmark = pytest.mark.multihost

BUILD = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("data",))
state = {f"w{i}": jax.make_array_from_callback(
             (1024, 1024), NamedSharding(mesh, P("data")),
             lambda idx: np.ones((1024, 1024), np.float32)[idx])
         for i in range(4)}
"""


@pytest.fixture(scope="module")
def cluster(ip, tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    ip.run_line_magic("ckpt_cluster", f"start -n 2 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    ip.run_cell_magic("px", "", BUILD)
    yield {"root": root, "magics": magics}
    if magics.cluster is not None:
        ip.run_line_magic("ckpt_cluster", "stop")


def _slow_down():  # runs on the engines
    import jax

    from nbckpt.engine import faults

    faults.clear()
    # Process 0 waits for 1 at write_complete, then 1 waits for 0 at commit_complete
    # while 0 finalizes; each stall is a state the widget should show on its own.
    if jax.process_index() == 1:
        faults.stall("write", 1.0)
    else:
        faults.stall("finalize", 0.8)
        faults.stall("barrier:commit_complete", 0.8)


def _clear():
    from nbckpt.engine import faults

    faults.clear()


def test_a_long_save_updates_the_widget_by_itself(ip, cluster):
    magics = cluster["magics"]
    magics.cluster.view.apply_sync(_slow_down)
    try:
        handle = ip.run_line_magic("ckpt_save", "state --step 1")
        widget = magics.views[handle.op]
        first = [r["phase"] for r in widget.rows]
        seen: list[tuple] = []
        widget.observe(
            lambda c: seen.append(tuple((r["phase"], r["fraction"]) for r in c.new)),
            names="rows",
        )
        # No other cell runs: only the widget's own updater changes it.
        assert widget.live is not None and widget.live.join(60)
    finally:
        magics.cluster.view.apply_sync(_clear)
    assert widget.status == "committed"
    assert [r["status"] for r in widget.rows] == ["committed", "committed"]
    assert len(seen) >= 3, seen
    phases = [tuple(p for p, _ in s) for s in seen]
    # Process 0 stalls as it enters finalize, then at commit_complete: the rows name
    # those phases (the protocol's words), not the events that preceded them.
    assert ("finalize", "barrier:commit_complete") in phases, phases
    assert ("barrier:commit_complete", "barrier:commit_complete") in phases, phases
    assert "committed" not in first, first  # the widget showed the save before it ended
    # While process 0 waited at write_complete the widget named process 1 as missing.
    waiting = [b for r in widget.rows for b in r["barriers"] if b["name"] == "write_complete"]
    assert "waited for 1" in waiting[0]["text"]


def test_status_of_an_op_rebuilds_the_view_from_the_journal(ip, cluster, capsys):
    magics = cluster["magics"]
    op = magics.client.handles[-1].op
    capsys.readouterr()
    ip.run_line_magic("ckpt_status", f"{op} --dir {cluster['root']}")
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"save of step 1 ({op}): committed"
    assert re.search(r"process 0: 100%.*committed", out)
    assert re.search(r"process 1: 100%.*committed", out)
    # The journal folder itself names the root too.
    ip.run_line_magic("ckpt_show", str(cluster["root"] / ".nbckpt" / "ops" / op))
    assert "committed" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no operation 'nope'"):
        ip.run_line_magic("ckpt_show", "nope")


def test_save_wait_without_widgets_draws_text_bars_and_quiet_draws_nothing(ip, cluster, capsys):
    magics = cluster["magics"]
    capsys.readouterr()
    ip.run_line_magic("ckpt_save", "state --step 2 --wait")
    err = capsys.readouterr().err
    assert "save 2 process 0" in err and "save 2 process 1" in err and "committed" in err
    n = len(magics.views)
    handle = ip.run_line_magic("ckpt_save", "state --step 3 --quiet")
    handle.wait(60)
    assert len(magics.views) == n and "process 0" not in capsys.readouterr().err


def test_timeline_magic_returns_a_figure_and_writes_png(ip, cluster, tmp_path, capsys):
    png = tmp_path / "t.png"
    fig = ip.run_line_magic("ckpt_timeline", f"--save {png}")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["process 0", "process 1"]
    assert f"written to {png}" in capsys.readouterr().out
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(UsageError, match=r"ending in \.png"):
        ip.run_line_magic("ckpt_timeline", "--save t.jpg")


def test_barrier_in_a_plain_shell_prints_its_table(ip, cluster, capsys):
    ip.run_line_magic("ckpt_barrier", "sync")
    out = capsys.readouterr().out
    assert "barrier 'sync'" in out and re.search(r"^\s+1\s+\d", out, re.M)
    assert threading.active_count() < 50
    time.sleep(0)
