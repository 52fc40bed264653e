"""Functions that ``benchmarks/compare.py`` and ``benchmarks/memory.py`` run in the workers.

Each runs inside one JAX process of a :class:`nbckpt.procgroup.ProcessGroup`, on every
process at once. Times are taken between two barriers where the measure is collective
(the raw tensorstore figures), and from the call to its return where it is what a user
waits for (``save``, ``wait_until_finished``, ``restore``): the parent takes the slowest
process.

``NBCKPT_BENCH_NO_JOURNAL=1`` in a worker's environment, or ``journal=False`` on
:func:`nb_save`, swaps ``JournalWriter.emit`` for a no-op in that process, so that the
journal's own cost can be measured. It is a benchmark switch, not a user knob.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

LEAVES = 8
_state: dict[str, Any] = {}


# -- memory ---------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5\n")
        return True
    except OSError:
        return False


class _Peak:
    """Peak resident memory above the RSS at the start, in bytes."""

    def __init__(self) -> None:
        self.reset_ok = _reset_peak()
        self.base = _status_kib("VmRSS") * 1024

    def above_base(self) -> int:
        return max(0, _status_kib("VmHWM") * 1024 - self.base)


# -- the state ------------------------------------------------------------------------


def build(nbytes: int, leaves: int = LEAVES) -> dict[str, int]:
    """Build ``leaves`` float32 arrays of ``nbytes`` in total, sharded over every device.

    Returns the total bytes and the bytes this process owns.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    _state.clear()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    n = jax.device_count()
    rows = max(n, nbytes // 4 // leaves // 1024 // n * n)

    def block(idx: Any) -> np.ndarray:
        # Random values, like trained weights: a constant fill would let a compressing
        # checkpointer (Orbax's zstd) write almost nothing.
        start, stop, _ = idx[0].indices(rows)
        rng = np.random.default_rng(start)
        return rng.random((stop - start, 1024), dtype=np.float32)

    tree = {
        f"w{i}": jax.make_array_from_callback((rows, 1024), sharding, block) for i in range(leaves)
    }
    jax.block_until_ready(tree)
    _state["tree"] = tree
    _state["sharding"] = sharding
    owned = sum(s.data.nbytes for a in tree.values() for s in a.addressable_shards)
    return {"total": rows * 1024 * 4 * leaves, "owned": int(owned)}


def _abstract() -> dict[str, Any]:
    import jax

    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=_state["sharding"])
        for k, v in _state["tree"].items()
    }


def _check(out: dict[str, Any]) -> None:
    """Spot-check a restored tree against the state (a wrong restore is no figure)."""
    import numpy as np

    for k, v in _state["tree"].items():
        a = out[k].addressable_shards[0].data
        b = v.addressable_shards[0].data
        if not np.array_equal(np.asarray(a)[:2], np.asarray(b)[:2]):
            raise AssertionError(f"restored leaf {k} differs from the saved one")


def _journal(enabled: bool) -> None:
    from nbckpt.journal import JournalWriter

    original = _state.setdefault("emit", JournalWriter.emit)
    off = not enabled or os.environ.get("NBCKPT_BENCH_NO_JOURNAL") == "1"
    JournalWriter.emit = (lambda self, event, **kw: None) if off else original  # type: ignore[method-assign]


# -- nbckpt ---------------------------------------------------------------------------


def nb_save(
    root: str, step: int, journal: bool = True, format: str | None = None
) -> dict[str, float]:
    """Save the state with nbckpt; time to return, time to durable commit, peak memory.

    ``format`` is the save option (None: nbckpt's own layout; ``"orbax"``: Orbax's).
    """
    from nbckpt.engine import AsyncCheckpointer

    _journal(journal)
    ckptr = AsyncCheckpointer(root)
    peak = _Peak()
    t0 = time.perf_counter()
    ckptr.save(step, _state["tree"], format=format)
    blocked = time.perf_counter() - t0
    ckptr.wait_until_finished()
    commit = time.perf_counter() - t0
    _journal(True)
    return {"blocked": blocked, "commit": commit, "peak": peak.above_base()}


def nb_restore(root: str, step: int) -> float:
    """Restore the state with nbckpt into the same shardings; seconds."""
    import jax

    from nbckpt.engine import AsyncCheckpointer

    ckptr = AsyncCheckpointer(root)  # made before the clock starts, as Orbax's is
    t0 = time.perf_counter()
    out = ckptr.restore(step, target=_abstract())
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    _check(out)
    return elapsed


def nb_repeated_saves(root: str, count: int) -> list[dict[str, int]]:
    """Save ``count`` times in a row (retention keeps 2).

    Per save: ``peak``, the process's resident high-water mark during the save
    (reset before it), and ``above``, that peak above the RSS just before the save.
    """
    from nbckpt.engine import AsyncCheckpointer

    ckptr = AsyncCheckpointer(root, max_to_keep=2)
    out = []
    for step in range(count):
        peak = _Peak()
        ckptr.save(step, _state["tree"])
        ckptr.wait_until_finished()
        out.append({"peak": _status_kib("VmHWM") * 1024, "above": peak.above_base()})
    return out


def rss() -> int:
    """This process's resident memory, in bytes."""
    return _status_kib("VmRSS") * 1024


# -- Orbax ----------------------------------------------------------------------------


def orbax_version() -> str | None:
    """Orbax's version, or None if it is not installed."""
    try:
        from importlib.metadata import version

        return version("orbax-checkpoint")
    except Exception:
        return None


def orbax_save(path: str) -> dict[str, float]:
    """Save the state with Orbax's durable defaults (zstd, OCDBT, fsync)."""
    import orbax.checkpoint as ocp

    ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
    peak = _Peak()
    t0 = time.perf_counter()
    ckptr.save(path, args=ocp.args.StandardSave(_state["tree"]))
    blocked = time.perf_counter() - t0
    ckptr.wait_until_finished()
    commit = time.perf_counter() - t0
    ckptr.close()
    return {"blocked": blocked, "commit": commit, "peak": peak.above_base()}


def orbax_restore(path: str) -> float:
    """Restore the state with Orbax into the same shardings; seconds."""
    import jax
    import orbax.checkpoint as ocp

    ckptr = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    t0 = time.perf_counter()
    out = ckptr.restore(path, args=ocp.args.StandardRestore(_abstract()))
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    _check(out)
    return elapsed


# -- the physical limit: plain tensorstore --------------------------------------------


def _raw_spec(path: Path) -> dict[str, Any]:
    return {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}


def _sync() -> Any:
    from nbckpt.engine import Synchronizer, default_client

    return Synchronizer(default_client())


def raw_write(directory: str, tag: str) -> float:
    """Write every owned shard as one uncompressed zarr chunk with plain tensorstore.

    tensorstore's default context fsyncs every file before a write commits. Timed from
    a barrier after the arrays exist to a barrier after every process's writes.
    """
    import jax
    import numpy as np
    import tensorstore as ts

    sync = _sync()
    base = Path(directory)
    tree = _state["tree"]
    if jax.process_index() == 0:
        base.mkdir(parents=True, exist_ok=True)
        for k, v in tree.items():
            spec = _raw_spec(base / k)
            shard = _state["sharding"].shard_shape(v.shape)
            spec["metadata"] = {"shape": list(v.shape), "chunks": list(shard), "compressor": None}
            ts.open(spec, create=True, dtype=ts.float32).result()
    sync.barrier("bench-raw", f"{tag}-created", timeout_s=120)
    stores = {k: ts.open(_raw_spec(base / k), open=True).result() for k in tree}
    t0 = time.perf_counter()
    futures = [
        stores[k][s.index].write(np.asarray(s.data), can_reference_source_data_indefinitely=True)
        for k, v in tree.items()
        for s in v.addressable_shards
        if s.replica_id == 0
    ]
    for f in futures:
        f.result()
    sync.barrier("bench-raw", f"{tag}-written", timeout_s=600)
    return time.perf_counter() - t0


def raw_read(directory: str, tag: str) -> float:
    """Read every owned shard back with plain tensorstore (no cache); seconds."""
    import tensorstore as ts

    sync = _sync()
    base = Path(directory)
    tree = _state["tree"]
    ctx = ts.Context({"cache_pool": {"total_bytes_limit": 0}})
    stores = {k: ts.open(_raw_spec(base / k), open=True, context=ctx).result() for k in tree}
    sync.barrier("bench-raw", f"{tag}-read0", timeout_s=120)
    t0 = time.perf_counter()
    futures = [stores[k][s.index].read() for k, v in tree.items() for s in v.addressable_shards]
    for f in futures:
        f.result()
    sync.barrier("bench-raw", f"{tag}-read1", timeout_s=600)
    return time.perf_counter() - t0


# -- barriers -------------------------------------------------------------------------


def barriers(count: int, tag: str) -> float:
    """Median round trip of ``count`` nbckpt barriers, seconds."""
    sync = _sync()
    times = []
    for i in range(count):
        t0 = time.perf_counter()
        sync.barrier(f"bench-barrier-{tag}", f"b{i}", timeout_s=30)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def jax_barriers(count: int, tag: str) -> float:
    """Median round trip of ``count`` coordination-service ``wait_at_barrier`` calls."""
    from jax._src.distributed import global_state

    client = global_state.client
    assert client is not None, "jax.distributed is not initialized"
    times = []
    for i in range(count):
        t0 = time.perf_counter()
        client.wait_at_barrier(f"bench-wab-{tag}-{i}", 30_000)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
