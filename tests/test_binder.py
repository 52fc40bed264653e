"""The Binder path: a fresh virtual environment set up as binder/ says.

repo2docker itself needs Docker, which this machine does not run; the test replays
its steps for a requirements.txt repository: install binder/requirements.txt, run
binder/postBuild from the repository root, then execute the quickstart with the
environment's own Jupyter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.multihost


def test_binder_environment_builds_and_runs_the_quickstart(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    env.pop("PYTHONPATH", None)
    # Build from a copy without the developer's build outputs, like a fresh clone.
    src = tmp_path / "repo"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".venv",
            "node_modules",
            ".git",
            "artifacts",
            "lib",
            "*.egg-info",
            ".*_cache",
            "labextension/lib",
        ),
    )
    shutil.rmtree(src / "nbckpt" / "labextension", ignore_errors=True)
    run = {"cwd": src, "env": env, "check": True, "capture_output": True, "text": True}
    subprocess.run(
        [bin_dir / "python", "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], **run
    )
    post = subprocess.run(["bash", "binder/postBuild"], **run)
    assert "nbckpt" in post.stdout and "enabled" in post.stdout
    out = tmp_path / "quickstart.ipynb"
    subprocess.run(
        [
            bin_dir / "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.timeout=600",
            "--output",
            str(out),
            "notebooks/01_quickstart.ipynb",
        ],
        **run,
    )
    text = out.read_text()
    assert "restored state is identical" in text and "cluster stopped" in text
    assert '"output_type": "error"' not in text
