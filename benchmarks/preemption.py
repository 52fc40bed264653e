"""Preemption: from the notice to the committed step and a clean exit, beside the grace.

Run: ``.venv/bin/python benchmarks/preemption.py [--sizes 256M,1G] [--reps 3]``

Per size and repetition, a fresh group of 4 real JAX processes (``ProcessGroup``, one
CPU device each) builds an ``fsdp`` state of that many random bytes
(``benchmarks/_workers.build``) and trains: a jitted update of every leaf and an
all-reduce of a loss per step, then ``reached_preemption(step)``. Once every process
has passed step 3, this process sends SIGTERM to process 1 and times, from that moment:

- ``agreed``: until the last process learned the agreed step (its check returned True);
- ``committed``: until the last process's ``wait_until_finished`` returned (the step
  is durable and complete);
- ``exited``: until every process has exited (``ProcessGroup.close``), with its code.

The per-step cost of checking is timed in the same processes before the notice:
``reached_preemption`` called 200,000 times in a row, nanoseconds per call (the median
over processes). Medians over repetitions, with their range; the machine is shared, so
repeat and compare runs made at the same time only.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO)]

from nbckpt.procgroup import ProcessGroup  # noqa: E402

W = "_preempt_workers"
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
GRACE_S = 30.0
PROCESSES = 4
TOLD = 1


def _size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def _wait_for_steps(progress: Path, n: int, at_least: int, timeout_s: float = 300) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        marks = [progress / str(p) for p in range(n)]
        if all(m.exists() and int(m.read_text() or -1) >= at_least for m in marks):
            return
        time.sleep(0.01)
    raise TimeoutError(f"the processes did not reach step {at_least} in {timeout_s:g} s")


def one_run(nbytes: int, where: Path) -> dict[str, float]:
    """One preemption of a 4-process job training a state of ``nbytes``; seconds."""
    root, progress = where / "ckpt", where / "progress"
    progress.mkdir(parents=True)
    group = ProcessGroup(PROCESSES, recoverable=True, env=ENV)
    try:
        group.run(f"{W}:build", nbytes)
        costs = group.run(f"{W}:check_cost", str(root), 200_000)
        group.submit(f"{W}:train", str(root), str(progress), GRACE_S)
        _wait_for_steps(progress, PROCESSES, 3)
        t0 = time.time()
        os.kill(group.pids[TOLD], signal.SIGTERM)
        results = group.collect("train", timeout_s=GRACE_S * 4)
    except BaseException:
        group.close(timeout_s=10)
        raise
    group.close(timeout_s=GRACE_S)
    exited = time.time() - t0
    codes = group.returncodes
    if codes != [0] * PROCESSES or len({r["step"] for r in results}) != 1:
        raise RuntimeError(f"a run went wrong: exit codes {codes}, results {results}")
    return {
        "agreed": max(r["t_agreed"] for r in results) - t0,
        "committed": max(r["t_committed"] for r in results) - t0,
        "exited": exited,
        "check_ns": statistics.median(costs),
    }


def _cell(values: list[float], scale: float, unit: str) -> str:
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    return f"{med:.2f} {unit} ({lo:.2f}-{hi:.2f})" if len(values) > 1 else f"{med:.2f} {unit}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256M,1G", help="state sizes, e.g. 256M,1G")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per size")
    parser.add_argument("--dir", default=None, help="where the roots go (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = [_size(s) for s in args.sizes.split(",")]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="nbckpt-preempt-"))
    print(f"# Preemption: notice to commit and exit ({PROCESSES} processes)\n")
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    rows = []
    for nbytes in sizes:
        runs = []
        for rep in range(args.reps):
            runs.append(one_run(nbytes, base / f"{nbytes}-{rep}"))
            print(f"  {nbytes / 2**20:.0f} MiB rep {rep + 1}: {runs[-1]}", flush=True)
        rows.append((nbytes, runs))
    print(f"\nload after: {os.getloadavg()[0]:.1f}\n")
    print(
        "| state | notice -> agreed | notice -> committed | notice -> all exited "
        "| grace | committed / grace |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for nbytes, runs in rows:
        committed = [r["committed"] for r in runs]
        print(
            f"| {nbytes / 2**20:.0f} MiB | {_cell([r['agreed'] for r in runs], 1, 's')} "
            f"| {_cell(committed, 1, 's')} | {_cell([r['exited'] for r in runs], 1, 's')} "
            f"| {GRACE_S:.0f} s | {statistics.median(committed) / GRACE_S:.3f} |"
        )
    checks = [r["check_ns"] for _, runs in rows for r in runs]
    print(
        f"\n`reached_preemption` before a notice: {_cell(checks, 1, 'ns')} per call "
        f"(median over processes, per run; range over runs)"
    )


if __name__ == "__main__":
    main()
