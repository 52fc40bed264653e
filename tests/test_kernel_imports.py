"""The notebook's kernel never imports jax, tensorstore or the engine, even at work.

A fresh interpreter stands in for the kernel: it imports every notebook-side module,
starts a real two-engine cluster with ``%ckpt_cluster start``, builds state with
``%%px``, saves, waits, restores and checks it, uses the other magics that reach the
engines, stops, and then lists the modules it holds. A fresh interpreter is needed
because this test process has imported jax already (the other tests' fixtures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.multihost

REPO = Path(__file__).resolve().parent.parent

#: Every module the notebook side imports or may import (not the engine's).
NOTEBOOK_SIDE = [
    "nbckpt",
    "nbckpt.session.client",
    "nbckpt.session.cluster",
    "nbckpt.magics.commands",
    "nbckpt.views.monitor",
    "nbckpt.journal",
    "nbckpt.widgets",
    "nbckpt.formats.inventory",
    "nbckpt.formats.fsck",
    "nbckpt.formats.layout",
    "nbckpt.server",
    "nbckpt.protocol",
    "nbckpt.errors",
]

KERNEL = textwrap.dedent(
    """
    import json, sys

    root = sys.argv[1]
    before = sorted(m for m in ("jax", "tensorstore") if m in sys.modules)
    import {imports}
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbckpt")
    shell.run_line_magic("ckpt_cluster", f"start -n 2 --dir {{root}}")
    try:
        shell.run_cell_magic("px", "", '''
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("data",))
    full = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    state = {{"w": jax.make_array_from_callback((8, 4), NamedSharding(mesh, P("data")),
                                               lambda idx: full[idx]), "lr": 0.5}}
    ''')
        shell.run_line_magic("ckpt_save", "state --step 1 --wait --quiet")
        shell.run_line_magic("ckpt_save", "state --step 2 --quiet")
        shell.run_line_magic("ckpt_wait", "")
        shell.run_line_magic("ckpt_restore", "restored --step 1")
        # %px blocks and raises the engines' errors, so a wrong restore fails here.
        shell.run_cell_magic("px", "", '''
    assert all(np.array_equal(s.data, full[s.index]) for s in restored["w"].addressable_shards)
    assert restored["lr"] == 0.5
    ''')
        shell.run_line_magic("ckpt_barrier", "sync")
        shell.run_line_magic("ckpt_status", "")
        shell.run_line_magic("ckpt_cluster", "status")
        shell.run_line_magic("ckpt_fault", "list")
        shell.run_line_magic("ckpt_ls", "")
    finally:
        shell.run_line_magic("ckpt_cluster", "stop")
    heavy = ("jax", "jaxlib", "tensorstore", "nbckpt.engine")
    print(json.dumps({{
        "before": before,
        "after": sorted(m for m in sys.modules if m in heavy or m.startswith("nbckpt.engine.")),
    }}))
    """
).format(imports=", ".join(NOTEBOOK_SIDE))


def test_the_kernel_never_imports_jax_or_the_engine(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", KERNEL, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "restored step 1 into 'restored' on 2 processes" in run.stdout
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["before"] == []  # the interpreter really started without them
    assert report["after"] == [], f"the kernel imported {report['after']}"
    assert (tmp_path / "ckpt" / "1").is_dir() and (tmp_path / "ckpt" / "2").is_dir()
