"""Crash consistency: kill a random process at a random moment of a save, many times.

Run: ``.venv/bin/python stress/crash_consistency.py --trials 200``

Each trial starts 2 JAX processes on 127.0.0.1 (with recoverability, so the survivor
lives on), commits step 1, starts saving step 2 with slowed writes, and SIGKILLs a
random process (process 0 included, which ends the whole job) after a random delay.
Then it checks the root from outside: every step ``all_steps`` lists must pass
``fsck.verify_step`` (metadata, shapes, every chunk's CRC-32) and hold exactly the
values that were saved. A partial step taken as complete, or a damaged complete step,
is a failure. The test suite runs the same trial 20 times.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
T = "tests.mh_tasks"


def check_root(root: Path) -> list[str]:
    """Return every violation of the atomicity contract found under ``root``."""
    import numpy as np

    from nbckpt.engine.restore.sources import source_for
    from nbckpt.formats.fsck import verify_step
    from nbckpt.formats.layout import METADATA_FILE, all_steps
    from tests.mh_tasks import full_values

    problems = []
    for step in all_steps(root):
        path = root / str(step)
        for p in verify_step(path):
            problems.append(f"step {step}: {p}")
        meta = json.loads((path / METADATA_FILE).read_text())
        source = source_for(path, meta)  # a leaf's zarr array, or its bytes in the packs
        full = full_values(step)
        for leaf in meta["leaves"]:
            short = leaf["name"].rsplit(".", 1)[-1]
            if leaf["kind"] == "scalar" or short not in full:
                continue
            data = source.open(leaf["name"]).result().read().result()
            if data.tobytes() != np.asarray(full[short]).tobytes():
                problems.append(f"step {step}: {leaf['name']} differs from what was saved")
    return problems


def run_trial(seed: int, base: Path) -> dict[str, Any]:
    """One trial; returns what happened and the violations found (none expected)."""
    from nbckpt.formats.layout import all_steps
    from nbckpt.procgroup import ProcessGroup

    rng = random.Random(seed)
    root = base / f"trial{seed}"
    victim = rng.choice([0, 1])
    delay = rng.uniform(0.0, 0.5)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with ProcessGroup(2, env=env, recoverable=True) as group:
        group.run(f"{T}:save", str(root), 1)
        group.run(f"{T}:slow_writes", 20.0)
        group.submit(f"{T}:save_and_time_failure", str(root), 2)
        time.sleep(delay)
        group.kill(victim)
        outcomes = group.outcomes(timeout_s=60)
    survivors = [r for ok, r in outcomes if ok and isinstance(r, dict)]
    return {
        "seed": seed,
        "victim": victim,
        "delay_s": round(delay, 3),
        "steps": all_steps(root),
        "survivor_errors": [r["error"] for r in survivors],
        "problems": check_root(root),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print a summary; exit 1 on any violation."""
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="nbckpt-crash-"))
    bad, committed = 0, 0
    t0 = time.perf_counter()
    try:
        for i in range(args.trials):
            res = run_trial(args.seed + i, base)
            committed += 2 in res["steps"]
            if res["problems"]:
                bad += 1
                print(f"trial {i}: VIOLATION {res}", flush=True)
            shutil.rmtree(base / f"trial{args.seed + i}", ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"{args.trials} trials in {time.perf_counter() - t0:.0f} s: step 2 committed before "
        f"the kill in {committed}, lost in {args.trials - committed}; partial steps taken "
        f"as complete or complete steps damaged: {bad}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
