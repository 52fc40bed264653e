"""``%ckpt_watch``: a training loop saves through the engine API in ``%%px --noblock``;
the notebook only watches. Real 2-engine cluster, real journals."""

from __future__ import annotations

import time

import pytest

from nbckpt.widgets.runs import watch_runs

pytestmark = pytest.mark.multihost

TRAIN = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from nbckpt.engine import AsyncCheckpointer, faults
mesh = Mesh(np.array(jax.devices()), ("data",))
state = {"w": jax.make_array_from_callback(
    (1024, 256), NamedSharding(mesh, P("data")),
    lambda idx: np.ones((1024, 256), np.float32)[idx])}
faults.clear()
faults.stall("write", 0.6)  # every save's write takes a while: the table sees it running
ckptr = AsyncCheckpointer(ROOT)
for step in (1, 2, 3):
    ckptr.save(step, state)
    time.sleep(0.2)  # training
ckptr.wait_until_finished()
faults.clear()
ckptr.close()
"""


@pytest.fixture(scope="module")
def cluster(ip, tmp_path_factory):
    root = tmp_path_factory.mktemp("watch")
    ip.run_line_magic("ckpt_cluster", f"start -n 2 --dir {root}")
    magics = ip.magics_manager.registry["NbckptMagics"]
    yield {"root": root, "magics": magics}
    if magics.cluster is not None:
        ip.run_line_magic("ckpt_cluster", "stop")


def test_the_table_follows_saves_the_engines_make_by_themselves(ip, cluster):
    root, magics = cluster["root"], cluster["magics"]
    view = watch_runs(root, display=False, interval_s=0.1)
    values: list[str] = []
    view.widget.observe(lambda c: values.append(c.new), names="value")
    assert "no saves yet" in view.widget.value
    code = f"import time\nROOT = {str(root)!r}\n" + TRAIN
    pending = magics.cluster.view.execute(code, block=False)  # what %%px --noblock does
    pending.get(timeout=120)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and view.widget.value.count('data-status="committed"') < 3:
        time.sleep(0.1)
    rows = view.watch.rows()
    view.close()
    assert [(r.step, r.status) for r in rows] == [
        (3, "committed"),
        (2, "committed"),
        (1, "committed"),
    ]
    assert all(r.by_status == {"committed": 2} for r in rows)
    # It drew the saves while they ran, without any cell asking it to.
    assert any('data-status="running"' in v for v in values), values[-1]
    assert view.live is None and "no longer watching" in view.widget.value


def test_the_magic_in_a_plain_shell_prints_the_table_and_stop_says_what_it_did(ip, cluster, capsys):
    ip.run_line_magic("ckpt_watch", "--last 2")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"saves under {cluster['root']}, newest first"
    assert lines[1].split()[:3] == ["step", "started", "state"]
    assert [ln.split()[0] for ln in lines[2:]] == ["3", "2"]
    ip.run_line_magic("ckpt_watch", "--stop")
    assert "nothing is being watched" in capsys.readouterr().out


def test_the_last_saves_share_one_time_axis(ip, cluster, tmp_path, capsys):
    png = tmp_path / "runs.png"
    fig = ip.run_line_magic("ckpt_timeline", f"--last 3 --save {png}")
    (ax,) = fig.axes
    labels = sorted(t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("label:"))
    assert labels == ["step 1", "step 2", "step 3"]
    commits = [c for c in ax.collections if (c.get_gid() or "").startswith("commit:")]
    assert len(commits) == 3
    # The saves follow one another on the axis: each starts after the one before began.
    starts = sorted(t.xy[0] for t in ax.texts if (t.get_gid() or "").startswith("label:"))
    assert starts[0] == 0.0 and starts[0] < starts[1] < starts[2]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["process 0", "process 1"]
    assert "timeline of the last 3 saves written to" in capsys.readouterr().out
    assert png.read_bytes()[:4] == b"\x89PNG"
