"""The demo: ``python -m nbckpt.demo`` or ``nbckpt demo``.

Four local JAX processes train, save asynchronously, restore and check bit for bit;
then each process's phases are printed from the journal. The parent process only
starts and drives the group; everything JAX happens in the workers, through the
``_worker_*`` functions below.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nbckpt.journal import OperationRecord, read_operation
from nbckpt.procgroup import ProcessGroup
from nbckpt.widgets.text import FollowNew

__all__ = ["main", "phase_table"]

_LEAVES = 8  # the state is split into this many arrays


# -- worker side (runs inside each JAX process) ------------------------------------------

_state: dict[str, Any] = {}


def _shardings() -> Any:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("data",))
    return NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())


def _worker_build(mib: int) -> int:
    """Build a sharded state of about ``mib`` MiB of float32, plus small extras."""
    import jax
    import numpy as np

    sharded, replicated = _shardings()
    n = jax.device_count()
    rows = max(n, (mib * 2**20 // 4 // _LEAVES // 1024) // n * n)

    def block(i: int, idx: tuple[slice, ...]) -> np.ndarray:
        start, stop, _ = idx[0].indices(rows)
        rng = np.random.default_rng((i, start))
        return rng.standard_normal((stop - start, 1024)).astype(np.float32)

    params = {
        f"layer{i}": jax.make_array_from_callback(
            (rows, 1024), sharded, functools.partial(block, i)
        )
        for i in range(_LEAVES)
    }
    _state["train"] = {
        "params": params,
        "bias": jax.make_array_from_callback(
            (1024,), replicated, lambda idx: np.zeros(1024, np.float32)[idx]
        ),
        "data_seed": np.arange(4, dtype=np.int64),
        "lr": 0.01,
    }
    return sum(int(a.size) * 4 for a in params.values())


def _digests(tree: Any) -> dict[str, str]:
    """Hash every shard this process holds, keyed by leaf and index."""
    import jax
    import numpy as np

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                data = np.asarray(shard.data).tobytes()
                out[f"{name}{shard.index}"] = hashlib.blake2b(data, digest_size=16).hexdigest()
        else:
            out[name] = hashlib.blake2b(np.asarray(leaf).tobytes(), digest_size=16).hexdigest()
    return out


def _worker_train(root: str, steps: int, save_every: int) -> dict[str, Any]:
    """Train for ``steps`` steps, saving every ``save_every``; report what happened."""
    import jax

    from nbckpt.engine import AsyncCheckpointer

    @jax.jit
    def update(params: Any) -> Any:
        return jax.tree.map(lambda p: p * 0.999 + 0.001, params)

    ckptr = AsyncCheckpointer(root, max_to_keep=2)
    state = _state["train"]
    saves: list[dict[str, Any]] = []
    saved: dict[int, Any] = {}
    for step in range(1, steps + 1):
        state = {**state, "params": update(state["params"])}
        jax.block_until_ready(state["params"])
        if saves and saves[-1]["committed_s"] is None:
            if ckptr.in_flight():
                saves[-1]["steps_during"] += 1
            else:
                saves[-1]["committed_s"] = time.perf_counter() - saves[-1]["t0"]
        if step % save_every == 0:
            t0 = time.perf_counter()
            ckptr.save(step, state)
            saves.append(
                {
                    "step": step,
                    "t0": t0,
                    "blocked_s": time.perf_counter() - t0,
                    "committed_s": None,
                    "steps_during": 0,
                    "op": ckptr.last_op,
                }
            )
            saved[step] = state
    ckptr.wait_until_finished()
    for s in saves:
        if s["committed_s"] is None:
            s["committed_s"] = time.perf_counter() - s["t0"]
        del s["t0"]
    last = saves[-1]["step"]
    _state["saved"] = saved[last]
    return {"saves": saves, "last": last}


def _worker_restore(root: str) -> dict[str, Any]:
    """Restore the latest step into the same shardings and compare every shard."""
    import jax

    from nbckpt.engine import AsyncCheckpointer

    sharded, replicated = _shardings()
    saved = _state["saved"]
    target = {
        "params": {k: sharded for k in saved["params"]},
        "bias": replicated,
        "data_seed": ...,
        "lr": ...,
    }
    ckptr = AsyncCheckpointer(root)
    t0 = time.perf_counter()
    restored = ckptr.restore(target=target)
    jax.block_until_ready(restored["params"])
    seconds = time.perf_counter() - t0
    same = _digests(restored) == _digests(saved) and restored["lr"] == saved["lr"]
    return {"identical": same, "seconds": seconds, "op": ckptr.last_op}


# -- parent side -------------------------------------------------------------------------


def phase_table(record: OperationRecord) -> str:
    """Format an operation's per-process phases as a text table (milliseconds).

    Each cell is ``start+duration``: when the phase began, counted from the
    operation's first event, and how long it took.
    """
    names: list[str] = []
    for proc in record.processes.values():
        for span in proc.phases:
            if span.name not in names:
                names.append(span.name)
    t0 = record.start or 0.0
    header = ["process", *names, "status"]
    rows = []
    for p, proc in sorted(record.processes.items()):
        cells = {s.name: s for s in proc.phases}
        row = [str(p)]
        for name in names:
            s = cells.get(name)
            if s is None:
                row.append("-")
            elif s.end is None:
                row.append(f"{(s.start - t0) * 1e3:.0f}+…")
            else:
                row.append(f"{(s.start - t0) * 1e3:.0f}+{(s.end - s.start) * 1e3:.0f}")
        row.append(proc.status)
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(
        prog="nbckpt demo",
        description="Start local JAX processes on 127.0.0.1, train while saving "
        "asynchronously, restore the latest step and check it bit for bit.",
    )
    parser.add_argument("--processes", type=int, default=4, help="JAX processes (default 4)")
    parser.add_argument("--devices-per-process", type=int, default=1, help="CPU devices each")
    parser.add_argument("--mib", type=int, default=256, help="state size in MiB (default 256)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--save-every", type=int, default=10, help="save period in steps")
    parser.add_argument("--root", help="checkpoint directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.processes < 1 or args.mib < 1 or args.save_every < 1 or args.steps < args.save_every:
        parser.error("need --processes >= 1, --mib >= 1 and --steps >= --save-every >= 1")

    made_root = args.root is None
    root = Path(args.root or tempfile.mkdtemp(prefix="nbckpt-demo-")).absolute()
    print(
        f"nbckpt demo: {args.processes} processes x {args.devices_per_process} CPU device(s) "
        f"on 127.0.0.1, ~{args.mib} MiB state, checkpoints in {root}"
    )
    try:
        t0 = time.perf_counter()
        with ProcessGroup(args.processes, devices_per_process=args.devices_per_process) as group:
            print(f"  processes joined by jax.distributed in {time.perf_counter() - t0:.1f} s")
            nbytes = group.run("nbckpt.demo:_worker_build", args.mib)[0]
            print(f"  state built: {nbytes / 2**20:.0f} MiB sharded over all devices")
            # The workers save in the background; here, each save's journal drives text
            # progress per process (on stderr) while they train.
            with FollowNew(root, "save"):
                trained = group.run(
                    "nbckpt.demo:_worker_train", str(root), args.steps, args.save_every
                )
            print("\n  step  save blocked  committed after  steps trained meanwhile (process 0)")
            for s in trained[0]["saves"]:
                print(
                    f"  {s['step']:>4}  {s['blocked_s'] * 1e3:>9.1f} ms  "
                    f"{s['committed_s'] * 1e3:>12.0f} ms  {s['steps_during']:>10}"
                )
            restored = group.run("nbckpt.demo:_worker_restore", str(root))
        last = trained[0]["last"]
        ok = all(r["identical"] for r in restored)
        slowest = max(r["seconds"] for r in restored)
        print(
            f"\n  restore of step {last}: "
            f"{'bit-identical on every process' if ok else 'MISMATCH'} "
            f"({slowest:.2f} s, {nbytes / 2**20 / slowest:.0f} MiB/s)"
        )
        op = trained[0]["saves"][-1]["op"]
        record = read_operation(root, op)
        print(f"\n  phases of {op} per process, ms as start+duration:")
        print("  " + phase_table(record).replace("\n", "\n  "))
        if not ok:
            print("nbckpt demo: restored state differs from the saved one", file=sys.stderr)
            return 1
        return 0
    finally:
        if made_root and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        elif made_root:
            print(f"  kept {root}")


if __name__ == "__main__":
    sys.exit(main())
