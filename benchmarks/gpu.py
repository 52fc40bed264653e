r"""nbckpt vs Orbax vs the device-to-host copy, in one JAX process on one GPU.

On the device machine, from the repository root, with the wheels of ``.whl/`` there
(google-crc32c: without it nbckpt's checksums fall back to zlib's CRC-32)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD \
        && PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --json $OUT/gpu.json

Here, on the CPU: ``.venv/bin/python benchmarks/gpu.py --quick`` (16 MiB, 1 repetition).

One process (no ``jax.distributed``: nbckpt uses its in-process client), on the platform
jax picks. The states (``_gpu_states``): ``fsdp`` at each of ``--sizes``, ``small``
(hundreds of small leaves) at ``--small-size``, ``transformer`` (compare.py's: a
12-layer model's parameters and AdamW state, 442 leaves) at ``--transformer-size``.
Each repetition, in an order that runs forward and backward in turns and
each on a fresh state: the device-to-host copy of every shard (``copy_to_host_async``
then ``np.asarray``), and where the device has pinned host memory the copy there
(``jax.device_put`` to ``pinned_host``, what nbckpt's snapshot does: the floor of its
blocking time); nbckpt
(``save`` returns, ``wait_until_finished``, cold restore into the same shardings);
Orbax (``AsyncCheckpointer(StandardCheckpointHandler())``, its defaults; cold restore);
plain files (the same bytes from host memory into one file, ``fdatasync``; read back
by 4 threads into reused buffers). The page cache is dropped before every read, and
every restore is checked against the saved values. Repetitions go round by round over
the states; none starts past ``--budget`` seconds, and at ``--timeout`` what was
measured is printed and the process exits. The last line is ``RESULT gpu=...``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_report import parse_size  # noqa: E402
from _gpu_states import (  # noqa: E402
    SMALL_SCALARS,
    State,
    fmt_size,
    free,
    fsdp_specs,
    shards,
    small_specs,
    transformer_specs,
)
from engine_bench import drop_cache, in_turn  # noqa: E402

FIGURES = {
    "d2h": "device-to-host copy (floor)",
    "d2h_pinned": "copy to pinned host memory",
    "nb_block": "nbckpt save blocks",
    "nb_durable": "nbckpt durable",
    "nb_restore": "nbckpt restore (cold)",
    "ob_block": "Orbax save blocks",
    "ob_durable": "Orbax durable",
    "ob_restore": "Orbax restore (cold)",
    "plain_write": "plain write + fdatasync",
    "plain_read": "plain read (cold)",
}
RATIOS = {  # name: (numerator, denominator), both medians
    "blocking_vs_d2h": ("nb_block", "d2h"),
    "blocking_vs_pinned": ("nb_block", "d2h_pinned"),
    "durable_vs_orbax": ("nb_durable", "ob_durable"),
    "restore_vs_orbax": ("nb_restore", "ob_restore"),
    "durable_vs_plain": ("nb_durable", "plain_write"),
    "restore_vs_plain": ("nb_restore", "plain_read"),
}
BLOCK, READERS = 16 * 2**20, 4
PACKAGES = ("orbax-checkpoint", "tensorstore", "numpy", "ml-dtypes", "google-crc32c")


def log(msg: str) -> None:
    print(msg, flush=True)


class Bench:
    """The four measures, each on a fresh state, with its files under ``base``."""

    def __init__(self, base: Path) -> None:
        self.base, self.cache, self.timeout_s = base, set[str](), 300.0

    def cold(self, path: Path) -> None:
        """Flush and evict ``path``'s files, so the read that follows is from the disk."""
        os.sync()
        try:
            self.cache.add(drop_cache(path))
        except OSError as e:
            self.cache.add(f"no ({e.strerror})")

    def d2h(self, st: State, seed: int) -> dict[str, float]:
        import jax

        from nbckpt.engine.save.snapshot import PINNED, has_pinned_host

        tree = st.fresh(seed)
        cpu = all(d.platform == "cpu" for a in shards(tree) for d in a.devices())
        t0 = time.perf_counter()
        datas = shards(tree)
        for d in datas:
            d.copy_to_host_async()
        # On a CPU device np.asarray is a view: copy, as nbckpt's snapshot does there.
        host = [np.array(d, copy=True) if cpu else np.asarray(d) for d in datas]
        seconds = time.perf_counter() - t0
        if sum(h.nbytes for h in host) != st.nbytes:
            raise AssertionError(f"D2H copied {sum(h.nbytes for h in host)} of {st.nbytes} B")
        free(tree)
        out = {"d2h": seconds}
        tree = st.fresh(seed + 1)
        datas = shards(tree)
        devices = [next(iter(d.devices())) for d in datas]
        if not cpu and all(has_pinned_host(d) for d in devices):
            # What nbckpt's snapshot does where the device has pinned host memory.
            kinds = [jax.sharding.SingleDeviceSharding(d, memory_kind=PINNED) for d in devices]
            t0 = time.perf_counter()
            host = [np.asarray(h) for h in jax.device_put(datas, kinds)]
            out["d2h_pinned"] = time.perf_counter() - t0
            del host
        free(tree)
        return out

    def _save_restore(self, st: State, seed: int, who: str, ops: Any) -> tuple[float, ...]:
        """Time ``ops``' save (return, durable) and cold restore; check and delete."""
        import jax

        tree, path = st.fresh(seed), self.base / f"{who}-{seed}"
        try:
            save, wait, restore = ops(path)
            t0 = time.perf_counter()
            save(tree)
            block = time.perf_counter() - t0
            wait()
            durable = time.perf_counter() - t0
            self.cold(path)
            target = st.target()
            t0 = time.perf_counter()
            out = jax.block_until_ready(restore(target))
            seconds = time.perf_counter() - t0
            st.verify(tree, out, who)
            free(out)
        finally:
            free(tree)
            shutil.rmtree(path, ignore_errors=True)
            os.sync()
        return block, durable, seconds

    def nbckpt(self, st: State, seed: int) -> dict[str, float]:
        from nbckpt.engine import AsyncCheckpointer

        def ops(root: Path) -> Any:
            ckptr = AsyncCheckpointer(root, timeout_s=self.timeout_s)

            def restore(target: Any) -> Any:
                return ckptr.restore(0, target=target)

            return lambda t: ckptr.save(0, t), ckptr.wait_until_finished, restore

        got = self._save_restore(st, seed, "nbckpt", ops)
        return dict(zip(("nb_block", "nb_durable", "nb_restore"), got, strict=True))

    def orbax(self, st: State, seed: int) -> dict[str, float]:
        import orbax.checkpoint as ocp

        def ops(path: Path) -> Any:
            ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
            reader = ocp.Checkpointer(ocp.StandardCheckpointHandler())

            def wait() -> None:
                ckptr.wait_until_finished()
                ckptr.close()

            return (
                lambda t: ckptr.save(path, args=ocp.args.StandardSave(t)),
                wait,
                lambda t: reader.restore(path, args=ocp.args.StandardRestore(t)),
            )

        got = self._save_restore(st, seed, "Orbax", ops)
        return dict(zip(("ob_block", "ob_durable", "ob_restore"), got, strict=True))

    def plain(self, st: State, seed: int) -> dict[str, float]:
        tree, path = st.fresh(seed), self.base / f"plain-{seed}"
        views = [np.asarray(d).reshape(-1).view(np.uint8) for d in shards(tree)]
        free(tree)
        path.mkdir()
        t0 = time.perf_counter()
        fd = os.open(path / "state.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for v in views:
                for start in range(0, v.nbytes, BLOCK):
                    piece = v[start : start + BLOCK].data
                    while piece.nbytes:
                        piece = piece[os.write(fd, piece) :]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        dfd = os.open(path, os.O_RDONLY)
        os.fsync(dfd)  # the new file's entry is part of durability, as for a checkpoint
        os.close(dfd)
        write = time.perf_counter() - t0
        del views
        self.cold(path)
        t0 = time.perf_counter()
        got = read_parallel(path / "state.bin", st.nbytes)
        read = time.perf_counter() - t0
        if got != st.nbytes:
            raise AssertionError(f"plain read {got} bytes of {st.nbytes}")
        shutil.rmtree(path, ignore_errors=True)
        os.sync()
        return {"plain_write": write, "plain_read": read}


def read_parallel(path: Path, size: int) -> int:
    """Read ``path`` in ``READERS`` contiguous parts at once, into reused buffers."""
    fd = os.open(path, os.O_RDONLY)
    step = -(-size // READERS // BLOCK) * BLOCK

    def part(start: int) -> int:
        buf, got = bytearray(BLOCK), 0
        while got < step and (n := os.preadv(fd, [buf], start + got)):
            got += n
        return min(got, step)

    try:
        with ThreadPoolExecutor(READERS) as pool:
            return sum(pool.map(part, range(0, size, step)))
    finally:
        os.close(fd)


# -- report ---------------------------------------------------------------------------


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def ratios(st: State) -> dict[str, float | None]:
    med = {k: statistics.median(v) for k, v in st.figures.items() if v}
    return {k: med[a] / med[b] if a in med and b in med else None for k, (a, b) in RATIOS.items()}


def report(meta: dict[str, Any], states: list[State], json_path: str | None) -> None:
    """Print the table and the RESULT line; write the JSON."""
    meta["load_end"] = [round(x, 2) for x in os.getloadavg()]
    lines = ["", "=" * 78]
    for st in states:
        lines.append(f"{st.label}: {st.nbytes} bytes in {len(st.specs)} arrays")
        lines.append(f"  {'seconds':30}{'min':>9}{'median':>9}{'max':>9}{'GB/s':>8}  n")
        for key, text in FIGURES.items():
            s = stats(st.figures.get(key, []))
            if not s:
                lines.append(f"  {text:30}{'n/a':>9}")
                continue
            rate = st.nbytes / 1e9 / s["median"] if s["median"] > 0 else float("nan")
            row = f"{s['min']:9.3f}{s['median']:9.3f}{s['max']:9.3f}{rate:8.2f}  {s['n']}"
            lines.append(f"  {text:30}{row}")
        parts = [f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in ratios(st).items()]
        lines.append("  nbckpt / other (medians; < 1: nbckpt faster): " + ", ".join(parts))
    cache = sorted(meta["cache"])
    yes = bool(cache) and not any(c.startswith("no") for c in cache)
    lines.append(f"cache dropped: {'yes' if yes else 'no'} ({', '.join(cache) or 'no read'})")
    lines.append(f"load average at start {meta['load_start']}, at end {meta['load_end']}")
    done = [s for s in states if s.name == "fsdp" and s.figures.get("nb_durable")]
    top = max(done, key=lambda s: s.nbytes, default=None)
    r = ratios(top) if top else {}
    val = {k: "n/a" if r.get(k) is None else f"{r[k]:.2f}" for k in RATIOS}
    meta["result"] = (
        f"RESULT gpu={meta.get('device_kind', 'unknown').replace(' ', '_')} "
        f"size={fmt_size(top.nbytes) if top else 'n/a'} "
        f"blocking_vs_d2h={val['blocking_vs_d2h']} durable_vs_orbax={val['durable_vs_orbax']} "
        f"restore_vs_orbax={val['restore_vs_orbax']} "
        f"blocking_vs_pinned={val['blocking_vs_pinned']}"
    )
    log("\n".join([*lines, meta["result"]]))
    if json_path:
        doc = {**meta, "cache": cache, "states": []}
        for st in states:
            figures = {k: {"all": v, **stats(v)} for k, v in st.figures.items()}
            doc["states"].append(
                {"state": st.name, "label": st.label, "bytes": st.nbytes, "arrays": len(st.specs)}
                | {"figures": figures, "ratios": ratios(st), "rep_seconds": st.rep_seconds}
            )
        Path(json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def describe() -> dict[str, Any]:
    """Devices, versions, nbckpt's commit and checksum."""
    import jax

    from nbckpt.formats.checksum import default_algorithm

    def git(*args: str) -> str:
        try:
            cmd = ["git", "-C", str(REPO), *args]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        return run.stdout.strip() if run.returncode == 0 else ""

    rev = git("rev-parse", "--short", "HEAD") or "unknown (no git here)"
    if git("status", "--porcelain", "-uno"):
        rev += " (tracked files modified)"
    versions: dict[str, str | None] = {}
    for p in (*("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin"), *PACKAGES):
        try:
            versions[p] = version(p)
        except PackageNotFoundError:
            versions[p] = None
    return {
        "devices": [str(d) for d in jax.devices()],
        "device_kind": str(jax.devices()[0].device_kind),
        "python": sys.version.split()[0],
        "versions": versions,
        "nbckpt_commit": rev,
        "nbckpt_checksum": default_algorithm(),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, print each repetition as it ends, then the table and the RESULT line."""
    t_start = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1G,4G", help="sizes of the fsdp state")
    parser.add_argument("--small-size", default="256M", help="size of the small-leaves state")
    parser.add_argument(
        "--transformer-size", default="1G", help="size of the transformer state ('' skips it)"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--root", help="where to write (a fresh folder is made in it)")
    parser.add_argument("--json", help="also write the figures here, as JSON")
    parser.add_argument("--quick", action="store_true", help="16 MiB states, 1 repetition")
    parser.add_argument("--no-orbax", action="store_true")
    parser.add_argument("--budget", type=float, default=270, help="start no rep past (s)")
    parser.add_argument("--timeout", type=float, default=330, help="report and exit at (s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.small_size, args.reps = "16M", "16M", 1
        args.transformer_size = args.transformer_size and "16M"
    base = Path(tempfile.mkdtemp(prefix="nbckpt-gpu-", dir=args.root))
    bench, states = Bench(base), list[State]()
    meta: dict[str, Any] = {"argv": sys.argv[1:], "root": str(base), "cache": bench.cache}
    meta["load_start"] = [round(x, 2) for x in os.getloadavg()]

    # Never hang: at --timeout print what was measured and leave; 20 s later, if that
    # report is stuck too, faulthandler prints every thread's stack and exits.
    def watchdog() -> None:
        time.sleep(max(0.0, t_start + args.timeout - time.monotonic()))
        log(f"TIMEOUT after {args.timeout:.0f} s: what was measured so far")
        try:
            report(meta, states, args.json)
        finally:
            shutil.rmtree(base, ignore_errors=True)
            os._exit(124)

    threading.Thread(target=watchdog, daemon=True).start()
    faulthandler.dump_traceback_later(args.timeout + 20, exit=True)
    try:
        import jax

        meta.update(describe())
        for key in ("devices", "python", "versions", "nbckpt_commit", "nbckpt_checksum"):
            log(f"{key}: {meta[key]}")
        free_gib = shutil.disk_usage(base).free / 2**30
        log(f"root: {base} ({free_gib:.0f} GiB free)")
        log("jax.distributed: not initialised (one process: nbckpt uses its in-process client)")
        if jax.default_backend() == "cpu" and not args.quick:
            log("WARNING: jax found no accelerator: these are CPU figures")
        n = jax.device_count()
        for size in dict.fromkeys(parse_size(s) for s in args.sizes.split(",") if s):
            states.append(State("fsdp", size, fsdp_specs(size, n)))
        if free_gib < 2.5 * max(st.nbytes for st in states) / 2**30:
            log("WARNING: the disk may fill: one checkpoint at a time is kept, pick --root")
        small = parse_size(args.small_size)
        states.insert(0, State("small", small, small_specs(small, n), SMALL_SCALARS))
        if args.transformer_size:
            size = parse_size(args.transformer_size)
            states.insert(1, State("transformer", size, transformer_specs(size, n)))
        systems: dict[str, Callable[[State, int], dict[str, float]]] = {
            "d2h": bench.d2h,
            "nbckpt": bench.nbckpt,
            "plain": bench.plain,
        }
        if not args.no_orbax:
            systems["orbax"] = bench.orbax

        def run(name: str, st: State, seed: int) -> dict[str, float]:
            """One measure; Orbax failing (not its values) leaves its columns n/a."""
            if name not in systems:
                return {}
            try:
                return systems[name](st, seed)
            except Exception as e:
                if name != "orbax" or isinstance(e, AssertionError):
                    raise
                log(f"Orbax failed, its figures read n/a from here: {e!r}")
                systems.pop(name, None)
                return {}

        # Imports, thread pools and compiled helpers on a tiny state, untimed.
        warm = State("warm-up", 2**24, fsdp_specs(2**24, n))
        for name in list(systems):
            run(name, warm, 0)
        log(f"warm-up done at {time.monotonic() - t_start:.1f} s")
        deadline = t_start + args.budget
        # Round by round, so that every state has a figure before any has three.
        for rep in range(args.reps):
            for st in states:
                # Skip a rep likely to end past the budget: one as long as this state's
                # longest, or as the largest measured state's scaled up to these bytes.
                ref = max((s for s in states if s.rep_seconds), key=lambda s: s.nbytes, default=st)
                scale = 1.0 if st.rep_seconds else max(1.0, st.nbytes / ref.nbytes)
                guess = max(st.rep_seconds or ref.rep_seconds or [0.0]) * scale
                if time.monotonic() + guess > deadline:
                    log(f"{st.label} rep {rep + 1}: skipped (about {guess:.0f} s, over budget)")
                    continue
                t0, got = time.monotonic(), dict[str, float]()
                for i, system in enumerate(in_turn(list(systems), rep)):
                    one = run(system, st, rep * 10 + i)
                    for k, v in one.items():  # kept at once: a timeout reports them
                        st.figures.setdefault(k, []).append(v)
                    got |= one
                st.rep_seconds.append(time.monotonic() - t0)
                text = ", ".join(f"{k} {v:.3f}" for k, v in got.items())
                log(f"{st.label} rep {rep + 1}/{args.reps} ({st.rep_seconds[-1]:.1f} s): {text}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        report(meta, states, args.json)
        faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # the report is printed; now the cause, loudly
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Past jax's and the thread pools' exit handlers: nothing is left to write, and a
    # run that must never hang should not wait on them.
    os._exit(code)
