"""The ``nbckpt`` command line: ``nbckpt fsck ROOT [--clean] [--verify]``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nbckpt.cli import main

REPO = Path(__file__).resolve().parent.parent


def _abandoned(root: Path) -> Path:
    """A root holding one abandoned save (a temporary directory without a journal)."""
    (root / "4.nbckpt-tmp").mkdir(parents=True)
    return root


def test_fsck_of_a_clean_root_exits_0(tmp_path, capsys):
    assert main(["fsck", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fsck {tmp_path}") and "0 abandoned, 0 corrupt" in out


def test_fsck_finds_problems_and_clean_removes_them(tmp_path, capsys):
    root = _abandoned(tmp_path / "r")
    assert main(["fsck", str(root)]) == 1
    assert "4.nbckpt-tmp" in capsys.readouterr().out and (root / "4.nbckpt-tmp").exists()
    assert main(["fsck", str(root), "--clean"]) == 0
    assert "(removed)" in capsys.readouterr().out and not (root / "4.nbckpt-tmp").exists()
    assert main(["fsck", str(root), "--verify"]) == 0


def test_fsck_usage_errors_exit_2_in_one_line(tmp_path, capsys):
    assert main(["fsck"]) == 2
    assert "ROOT" in capsys.readouterr().err
    assert main(["fsck", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nbckpt fsck: no directory") and err.count("\n") == 1
    assert main(["fsck", str(tmp_path), "--bogus"]) == 2


def test_the_nbckpt_command_runs_fsck(tmp_path):
    root = _abandoned(tmp_path / "r")
    done = subprocess.run(
        [sys.executable, "-m", "nbckpt.cli", "fsck", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "1 abandoned" in done.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "nbckpt.cli", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert "nbckpt fsck ROOT" in helped.stdout
