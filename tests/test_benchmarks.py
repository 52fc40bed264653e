"""Smoke test of the side-by-side benchmark: it runs and reports, speeds are not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

pytestmark = pytest.mark.multihost
COMPARE = Path(__file__).resolve().parent.parent / "benchmarks" / "compare.py"
# The benchmarks import jax-side code at import; the marker is read from the text.
KEEP_MARK = re.search(
    r'^KEEP_MARK = "(.*)"$', (COMPARE.parent / "_compare_report.py").read_text(), re.M
).group(1)
SECONDS = r"\d+\.\d\d s"
RATIO = r"\d+\.\d\dx"


def table_rows(report: str, heading: str) -> list[list[str]]:
    """The cells of the body rows of the first Markdown table after ``heading``."""
    after = report.split(heading, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(after) if ln.startswith("|"))
    rows = []
    for ln in after[start + 2 :]:  # past the header and the --- line
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows


def test_compare_refuses_a_negative_warm_up_in_one_line(tmp_path):
    # A negative count would have dropped the last repetitions' times, not the first's.
    cmd = [sys.executable, str(COMPARE), "--warmup", "-1", "--dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("--warmup must be 0 or more, got -1")
    assert list(tmp_path.iterdir()) == []  # refused before anything was measured


def test_compare_quick_reports_every_measure(tmp_path):
    out = tmp_path / "RESULTS.md"
    # A report from an earlier run, with notes written by hand after the marker.
    out.write_text(f"# old tables\n\n{KEEP_MARK}\n\n## Notes\n\nkept\n")
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
    assert "# old tables" not in report
    assert report.endswith(f"\n{KEEP_MARK}\n\n## Notes\n\nkept\n")
    for heading in (
        "## Machine",
        "### Save and cold restore",
        "### Barrier round trip",
        "### Journal and live-view overhead",
        "### Throughput by process count",
        "### Targets",
        "### Issue 29: done when",
    ):
        assert heading in report
    for measure in ("`save` blocks", "durable commit", "cold restore", "peak RSS"):
        assert measure in report
    if not has_orbax:
        assert "n/a" in report  # the Orbax columns are there, empty

    # Every state at --quick's one state size (16 MiB), each restore checked by the
    # workers, fsdp measured once for both tables.
    rows = {r[0]: r for r in table_rows(report, "### States")}
    assert sorted(rows) == ["fsdp", "many", "mesh2d", "replicated", "small", "transformer"]
    # Leaves; owned (replicas included) / unique share, with 4 processes: replicated
    # holds it all, mesh2d's (2, 2) mesh half-replicates every other leaf.
    assert [rows["fsdp"][i] for i in (1, 2, 3)] == ["16 MiB", "8", "4 MiB / 4 MiB"]
    assert rows["replicated"][3] == "16 MiB / 4 MiB"
    assert rows["mesh2d"][3] == "6 MiB / 4 MiB"
    assert rows["transformer"][2] == "442" and rows["many"][2] == "4006"
    for state, r in rows.items():
        # durable save and cold restore: nbckpt, Orbax, raw limit, nbckpt/raw (one
        # repetition: no spread), nbckpt/Orbax
        for nb, ob, limit, vs_raw, vs_orbax in (r[6:11], r[11:16]):
            assert re.fullmatch(SECONDS, nb), (state, r)
            assert ob == "n/a s" if not has_orbax else re.fullmatch(SECONDS, ob), (state, r)
            assert re.fullmatch(SECONDS + r" = \d+\.\d\d GB/s", limit), (state, r)
            assert re.fullmatch(RATIO, vs_raw), (state, r)
            assert vs_orbax == "n/a" if not has_orbax else re.fullmatch(RATIO, vs_orbax)
        assert re.fullmatch(RATIO, r[16]), (state, r)
    assert rows["fsdp"][16] == "1.00x"
    target = rf"\| replicated restore / sharded restore \| {RATIO} \| <= 1\.3x \| (yes|NO) \|"
    assert re.search(target, report)
    assert "replicated restore / sharded restore" in lines[-1]
    for name in (
        r"durable save vs raw tensorstore at 8 MiB",
        r"durable save GB/s at 16 MiB / at 16 MiB",
        r"peak memory / owned bytes, 8 MiB to 16 MiB",
        r"barrier round trip vs the service's `wait_at_barrier`",
    ):
        assert re.search(rf"\| {name} \| [^|]+ \| [<>]= [\d.]+x? \| (yes|NO) \|", report), name
    # Every state and size measured is also set against a plain read of its own files.
    plain = table_rows(report, "### Cold restore against a plain read of its own files")
    assert sorted((r[0], r[1]) for r in plain) == sorted(
        [(state, r[1]) for state, r in rows.items()] + [("fsdp", "8 MiB")]
    )
    for r in plain:
        assert int(r[2]) >= 1, r  # a process reads at least one file (its pack)
        assert all(re.fullmatch(SECONDS, c) for c in r[3:6]), r
        assert all(re.fullmatch(RATIO, c) for c in r[6:8]), r
    # Issue 29's goals: the barrier's judged; --quick's sizes stand for none of the states'.
    goal = r"\| barrier round trip / jax `wait_at_barrier` \| [^|]+ \| <= 1\.0x \| (yes|NO) \|"
    assert re.search(goal, report)
    assert "| `transformer` 1 GiB durable save vs the plain-file limit | not run |" in report
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


def test_journal_summary_gathers_every_record_and_leaves_only_the_summary():
    # The script checks itself that only the summary is left after each gathering.
    script = COMPARE.with_name("journal_summary.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--processes", "3,20", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith("| 3 |") or line.startswith("| 20 |")
    ]
    assert len(rows) == 2 and all(row.count("|") == 6 for row in rows), proc.stdout


@pytest.mark.parametrize("store", ["moto", "gcs"])
def test_object_store_quick_reports_both_systems(store):
    # The script starts its own server (the dev extra has them), as the storage tests do.
    script = COMPARE.with_name("s3.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--store", store],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith(f"SUMMARY (4 processes, 8 MiB, {store})")
    assert "raw, restore" in lines[-1]
    for measure in ("durable save", "cold restore", "nbckpt/raw", "Requests the server answered"):
        assert measure in proc.stdout
    # Requests are counted from moto's log; the Go servers keep none.
    requests = "PUT" if store == "moto" else "n/a"
    assert "| 8 MiB | save |" in proc.stdout and requests in proc.stdout
    assert "Objects left in the bucket before stopping the server: 0." in proc.stdout


def test_tiers_quick_reports_recovery_from_every_tier(tmp_path):
    script = COMPARE.with_name("tiers.py")
    cmd = [sys.executable, str(script), "--quick", "--dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("RESULT recovery_vs_s3=") and "blocking_added=" in lines[-1]
    for measure in ("recovery: local + peers", "recovery: s3", "recovery: cold disk"):
        assert f"| {measure} |" in proc.stdout
    assert "a failure loses" in proc.stdout
    assert not list(tmp_path.iterdir()), "the scratch directory was left behind"


def test_gpu_quick_runs_on_whatever_jax_finds(tmp_path):
    # The figures mean something on a GPU only; here it proves the script still runs.
    script = COMPARE.with_name("gpu.py")
    cmd = [sys.executable, str(script), "--quick", "--root", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT gpu=") and "blocking_vs_d2h=" in last


@pytest.mark.parametrize(
    "script",
    ["compare", "engine_bench", "memory", "orbax_format", "scale", "tiers", "widget_overhead"],
)
def test_a_missing_dir_is_one_line_before_any_work(tmp_path, script):
    missing = tmp_path / "not-made"
    run = subprocess.run(
        [sys.executable, str(COMPARE.parent / f"{script}.py"), "--dir", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run
    assert run.stderr.strip() == (
        f"--dir {missing}: no such folder; create it first, or leave --dir out to write "
        "under a temporary folder"
    ), run.stderr
    assert not missing.exists()


def test_preemption_benchmark_reports_notice_to_commit_and_the_check_cost(tmp_path):
    script = COMPARE.parent / "preemption.py"
    cmd = [sys.executable, str(script), "--sizes", "8M", "--reps", "1", "--dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout, "# Preemption")
    assert len(rows) == 1 and rows[0][0] == "8 MiB"
    assert all(re.fullmatch(r"\d+\.\d\d s", cell) for cell in rows[0][1:4]), rows
    assert rows[0][4] == "30 s"
    assert re.search(r"`reached_preemption` before a notice: \d+\.\d\d ns per call", proc.stdout)
