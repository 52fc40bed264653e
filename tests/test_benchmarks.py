"""Smoke test of the side-by-side benchmark: it runs and reports, speeds are not checked."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

pytestmark = pytest.mark.multihost
COMPARE = Path(__file__).resolve().parent.parent / "benchmarks" / "compare.py"


def test_compare_quick_reports_every_measure(tmp_path):
    out = tmp_path / "RESULTS.md"
    cmd = [sys.executable, str(COMPARE), "--quick", "--dir", str(tmp_path), "--out", str(out)]
    has_orbax = find_spec("orbax") is not None
    if not has_orbax:
        cmd.append("--no-orbax")  # the dev install is lean: nbckpt and raw tensorstore only
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("SUMMARY (")
    assert "targets met" in lines[-1]
    report = out.read_text()
    for heading in (
        "## Machine",
        "### Save and cold restore",
        "### Barrier round trip",
        "### Journal and live-view overhead",
        "### Throughput by process count",
        "### Targets",
    ):
        assert heading in report
    for measure in ("`save` blocks", "durable commit", "cold restore", "peak RSS"):
        assert measure in report
    if not has_orbax:
        assert "n/a" in report  # the Orbax columns are there, empty
    assert not list(tmp_path.glob("nbckpt-compare-*")), "the scratch directory was left behind"


def test_orbax_format_quick_reports_every_system(tmp_path):
    # orbax-checkpoint is in the dev extra: its absence is a broken setup, not a skip.
    script = COMPARE.with_name("orbax_format.py")
    cmd = [sys.executable, str(script), "--quick", "--dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("SUMMARY (") and "vs Orbax" in lines[-1]
    for measure in ("durable save", "cold restore", "Orbax's cold restore", "bytes on disk"):
        assert measure in proc.stdout
    assert not list(tmp_path.glob("nbckpt-orbax-format-*")), "the scratch directory was left behind"


def test_s3_quick_reports_both_systems():
    # moto (the dev extra) is the S3 server the script starts itself, as the S3 tests do.
    script = COMPARE.with_name("s3.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("SUMMARY (4 processes, 8 MiB, moto S3")
    assert "raw, restore" in lines[-1]
    for measure in ("durable save", "cold restore", "nbckpt/raw", "Requests the server answered"):
        assert measure in proc.stdout
    assert "| 8 MiB | save |" in proc.stdout and "PUT" in proc.stdout
    assert "Objects left in the bucket before deleting it: 0." in proc.stdout
