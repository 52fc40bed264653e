"""The README's demo, end to end, on a small state (the real command, smaller sizes)."""

import subprocess
import sys

import pytest

from nbckpt.cli import main as cli_main
from nbckpt.demo import main as demo_main


@pytest.mark.multihost
def test_demo_runs_and_checks_bit_for_bit(tmp_path):
    root = tmp_path / "ckpt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbckpt.demo",
            "--processes",
            "2",
            "--mib",
            "8",
            "--steps",
            "4",
            "--save-every",
            "2",
            "--root",
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "restore of step 4: bit-identical on every process" in out
    assert "barrier:write_complete" in out and "committed" in out
    assert sorted(p.name for p in root.iterdir()) == [".nbckpt", "2", "4"]
    # Text progress per process, drawn by tqdm from each save's journal, on stderr.
    for step in (2, 4):
        for p in (0, 1):
            assert f"save {step} process {p}: 100%" in proc.stderr


def test_demo_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as info:
        demo_main(["--steps", "2", "--save-every", "5"])
    assert info.value.code == 2
    assert "--steps >= --save-every" in capsys.readouterr().err


def test_cli_usage(capsys):
    assert cli_main(["--help"]) == 0
    assert "nbckpt demo" in capsys.readouterr().out
    assert cli_main(["nope"]) == 2
    assert "unknown command" in capsys.readouterr().err
