"""Smoke test of the cluster start benchmark: it runs and reports, speeds are not checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multihost
REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "cluster_start.py"


def test_cluster_start_reports_both_starts_and_the_target(tmp_path):
    # The engines start in tmp_path and import nbckpt from the repository, as the kernel does.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--n", "2", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "## Cluster start: 2 local engines, 1 reps" in out
    assert re.search(r"^\| 1 \| plain then nbckpt \|( [0-9.]+ s \|){5}$", out, re.M), out
    assert re.search(r"^ratio nbckpt/plain \(medians of ready\): [0-9.]+$", out, re.M), out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"ready within 1\.25x of plain ipyparallel: (met|NOT met)", last)
