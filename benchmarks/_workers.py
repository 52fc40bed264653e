"""Functions that ``benchmarks/compare.py`` and ``benchmarks/memory.py`` run in the workers.

Each runs inside one JAX process of a :class:`nbckpt.procgroup.ProcessGroup`, on every
process at once. Times are taken between two barriers where the measure is collective
(the raw tensorstore and plain-file figures), and from the call to its return where it
is what a user waits for (``save``, ``wait_until_finished``, ``restore``): the parent
takes the slowest process.

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
    """Peak resident memory above ``base`` (by default the RSS at the start), in bytes.

    The high-water mark is reset to the RSS at the start either way.
    """

    def __init__(self, base: int | None = None) -> None:
        self.reset_ok = _reset_peak()
        self.base = _status_kib("VmRSS") * 1024 if base is None else base

    def above_base(self) -> int:
        return max(0, _status_kib("VmHWM") * 1024 - self.base)


# -- the state ------------------------------------------------------------------------

LAYOUTS = ("fsdp", "replicated", "mesh2d", "small", "transformer", "many")
"""The state layouts :func:`build` makes, in the order the reports list them."""

_COLS = 1024
_SMALL_LAYERS = 64  # bias + scale per layer, in params, mu and nu: 384 small leaves
_SMALL_MAX_KIB = 64


def _random(shape: tuple[int, ...], dtype: Any, sharding: Any, seed: int) -> Any:
    """A jax array of random values, each shard generated from its global position.

    Seeding by position makes every replica of a shard identical in every process, as
    a replicated parameter is in training. Random values, like trained weights: a
    constant fill would let a compressing checkpointer (Orbax's zstd) write almost
    nothing.
    """
    import jax
    import numpy as np

    def block(idx: Any) -> Any:
        ranges = [range(*s.indices(dim)) for s, dim in zip(idx, shape, strict=True)]
        rng = np.random.default_rng([seed, *(r.start for r in ranges)])
        size = tuple(len(r) for r in ranges)
        if np.issubdtype(dtype, np.integer):
            return rng.integers(0, 2**31 - 1, size=size, dtype=dtype)
        return np.asarray(rng.random(size, dtype=np.float32), dtype=dtype)

    return jax.make_array_from_callback(shape, sharding, block)


def _tree_fsdp(nbytes: int, leaves: int, replicated: bool) -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec() if replicated else PartitionSpec("data"))
    # The same shapes for both, so that their restores move the same unique bytes.
    rows = max(n, nbytes // 4 // leaves // _COLS // n * n)
    return {f"w{i}": _random((rows, _COLS), np.float32, sharding, i) for i in range(leaves)}


def _tree_mesh2d(nbytes: int, leaves: int) -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    n = jax.device_count()
    data = 2 if n % 2 == 0 else 1
    model = n // data
    mesh = Mesh(np.array(jax.devices()).reshape(data, model), ("data", "model"))
    specs = (PartitionSpec("data", "model"), PartitionSpec(None, "model"))
    cols = max(model, _COLS // model * model)
    rows = max(data, nbytes // 4 // leaves // cols // data * data)
    return {
        f"w{i}": _random((rows, cols), np.float32, NamedSharding(mesh, specs[i % 2]), i)
        for i in range(leaves)
    }


def _tree_small(nbytes: int) -> dict[str, Any]:
    """An optimizer-like state: a few large fsdp leaves, hundreds of small ones, scalars."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    fsdp = NamedSharding(mesh, PartitionSpec("data"))
    repl = NamedSharding(mesh, PartitionSpec())
    # A fixed seed: every process must build the same shapes.
    shapes = np.random.default_rng(0)
    small_count = 3 * 2 * _SMALL_LAYERS
    # Small leaves take at most about a quarter of a tiny state, so that it stays
    # mostly large leaves; from 64 MiB up their sizes span the whole 1-64 KiB.
    max_kib = int(min(_SMALL_MAX_KIB, max(1, nbytes / 2 / small_count / 2**10)))
    kib = shapes.integers(1, max_kib + 1, size=(_SMALL_LAYERS, 2))
    small_bytes = 3 * int(kib.sum()) * 2**10
    large = 3 * 2  # embedding and head kernel, in params, mu and nu
    rows = max(n, (nbytes - small_bytes) // 4 // large // _COLS // n * n)
    seeds = iter(range(1_000_000))

    def params_like() -> dict[str, Any]:
        tree: dict[str, Any] = {
            "embed": _random((rows, _COLS), np.float32, fsdp, next(seeds)),
            "head": {"kernel": _random((rows, _COLS), np.float32, fsdp, next(seeds))},
        }
        for i, (bias, scale) in enumerate(kib):
            tree[f"layer_{i}"] = {
                "bias": _random((int(bias) * 256,), np.float32, repl, next(seeds)),
                "scale": _random((int(scale) * 256,), np.float32, repl, next(seeds)),
            }
        return tree

    from _states import adam_like

    state = adam_like(params_like, _random((), np.int32, repl, next(seeds)))
    state["opt_state"]["learning_rate"] = 3e-4
    state["loss_scale"] = _random((), np.float32, repl, next(seeds))
    state["step"] = 12_345
    return state


def build(nbytes: int, leaves: int = LEAVES, layout: str = "fsdp") -> dict[str, int]:
    """Build a state of about ``nbytes`` unique bytes, with random values.

    Parameters
    ----------
    nbytes
        The state's unique bytes (a replicated byte counts once).
    leaves
        How many float32 arrays the ``fsdp``, ``replicated`` and ``mesh2d`` states have.
    layout
        One of :data:`LAYOUTS`. ``fsdp``: every leaf sharded on its first axis over a
        1-D mesh of all devices. ``replicated``: the same shapes, every leaf whole on
        every device (data parallelism). ``mesh2d``: a ("data", "model") mesh of
        shape (2, n/2), or (1, n) for an odd device count n; leaves alternate between
        ``P("data", "model")`` and ``P(None, "model")`` (replicated over "data").
        ``small``: a nested optimizer-like state: six large fsdp leaves, 384 small
        replicated ones (1-64 KiB), 0-d jax arrays and Python scalars.
        ``transformer``: a 12-layer transformer's parameters and AdamW state (442
        leaves, see ``_states``); ``many``: the same with 111 layers (4,006 leaves).

    Returns
    -------
    dict
        ``total``: the unique bytes of the state's jax arrays; ``owned``: the bytes of
        this process's shards, replicas included; ``unique_owned``: this process's
        even share of ``total``, what it would write if each unique byte were
        written once; ``leaves``: how many leaves the tree has.
    """
    import jax

    close_all()
    _state.clear()
    if layout in ("fsdp", "replicated"):
        tree = _tree_fsdp(nbytes, leaves, replicated=layout == "replicated")
    elif layout == "mesh2d":
        tree = _tree_mesh2d(nbytes, leaves)
    elif layout == "small":
        tree = _tree_small(nbytes)
    elif layout in ("transformer", "many"):
        from _states import MANY_LAYERS, TRANSFORMER_LAYERS, tree_transformer

        layers = TRANSFORMER_LAYERS if layout == "transformer" else MANY_LAYERS
        tree = tree_transformer(nbytes, layers, _random)
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    jax.block_until_ready(tree)
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    total = sum(int(a.nbytes) for a in arrays)
    owned = sum(int(s.data.nbytes) for a in arrays for s in a.addressable_shards)
    procs, index = jax.process_count(), jax.process_index()
    unique_owned = total // procs + (1 if index < total % procs else 0)
    _state.update(tree=tree, layout=layout, unique_owned=unique_owned)
    leaves = len(jax.tree.leaves(tree))
    return {"total": total, "owned": owned, "unique_owned": unique_owned, "leaves": leaves}


def _abstract() -> Any:
    """The state with each jax array as a ShapeDtypeStruct carrying its own sharding.

    Python scalars stay as they are: both restore APIs take them as host values.
    """
    import jax

    def spec(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree.map(spec, _state["tree"])


def _check(out: Any) -> None:
    """Check a restored tree against the state (a wrong restore is no figure).

    Every leaf: its path, type, shape, dtype and sharding, and the first and last two
    rows of every shard this process holds.
    """
    import jax
    import numpy as np

    layout = _state.get("layout", "fsdp")
    want = jax.tree_util.tree_flatten_with_path(_state["tree"])[0]
    got = jax.tree_util.tree_flatten_with_path(out)[0]
    want_paths = [jax.tree_util.keystr(p) for p, _ in want]
    got_paths = [jax.tree_util.keystr(p) for p, _ in got]
    if want_paths != got_paths:
        missing = sorted(set(want_paths) - set(got_paths))[:5]
        extra = sorted(set(got_paths) - set(want_paths))[:5]
        raise AssertionError(f"{layout}: restored paths differ: missing {missing}, extra {extra}")
    for (path, w), (_, g) in zip(want, got, strict=True):
        where = f"{layout}: restored leaf {jax.tree_util.keystr(path)}"
        if not isinstance(w, jax.Array):
            if isinstance(g, jax.Array) or g != w:
                raise AssertionError(f"{where} is {g!r}, saved {w!r}")
            continue
        if not isinstance(g, jax.Array) or g.shape != w.shape or g.dtype != w.dtype:
            raise AssertionError(f"{where} is {type(g).__name__} {getattr(g, 'shape', '')}")
        if not g.sharding.is_equivalent_to(w.sharding, w.ndim):
            raise AssertionError(f"{where} has sharding {g.sharding}, saved {w.sharding}")
        shards = {s.device: s.data for s in g.addressable_shards}
        for s in w.addressable_shards:
            a, b = np.asarray(shards[s.device]), np.asarray(s.data)
            if a.ndim:
                a, b = np.concatenate([a[:2], a[-2:]]), np.concatenate([b[:2], b[-2:]])
            if not np.array_equal(a, b):
                raise AssertionError(f"{where} differs from the saved one on {s.device}")


def _journal(enabled: bool) -> None:
    from nbckpt.journal import JournalWriter

    original = _state.setdefault("emit", JournalWriter.emit)
    off = not enabled or os.environ.get("NBCKPT_BENCH_NO_JOURNAL") == "1"
    JournalWriter.emit = (lambda self, event, **kw: None) if off else original  # type: ignore[method-assign]


# -- nbckpt ---------------------------------------------------------------------------


def nb_save(
    root: str,
    step: int,
    journal: bool = True,
    format: str | None = None,
    pack_bytes: int | None = None,
    steady: bool = False,
) -> dict[str, float]:
    """Save the state with nbckpt; time to return, time to durable commit, peak memory.

    ``format`` and ``pack_bytes`` are the save options (None: nbckpt's own layout,
    small leaves packed; ``"orbax"``: Orbax's; ``pack_bytes=0``: no leaf packed).
    ``steady``: save with the checkpointer kept for ``root`` since an earlier call
    (as a training loop does; its staging buffers and any host copies are reused);
    otherwise a new one.
    The peak memory counts the buffers the checkpointer kept from its last save.
    """
    from nbckpt.engine import AsyncCheckpointer

    _journal(journal)
    kept: dict[str, Any] = _state.setdefault("ckptrs", {})
    if steady:
        ckptr = kept.get(root) or kept.setdefault(root, AsyncCheckpointer(root))
    else:
        ckptr = AsyncCheckpointer(root)
    # What the checkpointer holds from its last save counts as this save's memory.
    peak = _Peak(_status_kib("VmRSS") * 1024 - ckptr._buffers.resident)
    _start("nb-save")
    t0 = time.perf_counter()
    ckptr.save(step, _state["tree"], format=format, pack_bytes=pack_bytes)
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
    target = _abstract()  # so is the target: a training script has it already
    _start("nb-restore")
    t0 = time.perf_counter()
    out = ckptr.restore(step, target=target)
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    _check(out)
    _let_go(out)
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


def orbax_save(path: str, steady: bool = False) -> dict[str, float]:
    """Save the state with Orbax's durable defaults (zstd, OCDBT, fsync).

    ``steady``: with one checkpointer kept across calls, as :func:`nb_save`.
    """
    import orbax.checkpoint as ocp

    kept: dict[str, Any] = _state.setdefault("ckptrs", {})
    if steady:
        ckptr = kept.get("orbax") or kept.setdefault(
            "orbax", ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
        )
    else:
        ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
    peak = _Peak()
    _start("orbax-save")
    t0 = time.perf_counter()
    ckptr.save(path, args=ocp.args.StandardSave(_state["tree"]))
    blocked = time.perf_counter() - t0
    ckptr.wait_until_finished()
    commit = time.perf_counter() - t0
    if not steady:
        ckptr.close()
    return {"blocked": blocked, "commit": commit, "peak": peak.above_base()}


def close_all() -> None:
    """Close the checkpointers kept by ``steady`` saves (their memory goes with them)."""
    for ckptr in _state.pop("ckptrs", {}).values():
        ckptr.close()


def orbax_restore(path: str) -> float:
    """Restore the state with Orbax into the same shardings; seconds."""
    import jax
    import orbax.checkpoint as ocp

    ckptr = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    target = _abstract()
    _start("orbax-restore")
    t0 = time.perf_counter()
    out = ckptr.restore(path, args=ocp.args.StandardRestore(target))
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    _check(out)
    _let_go(out)
    return elapsed


def _let_go(out: Any) -> None:
    """Free a restored tree now, before the next repetition drops the page cache.

    jaxlib lets go of a CPU array's host buffer on its next garbage collection, not
    when the array is deleted; a value that maps a pack
    (:mod:`nbckpt.engine.restore.mapped`) would keep its pages in the cache until then,
    and the next "cold" restore would find them there.
    """
    import gc

    import jax

    for leaf in jax.tree.leaves(out):
        if isinstance(leaf, jax.Array):
            leaf.delete()
    gc.collect()


# -- the physical limit: plain tensorstore --------------------------------------------


def _raw_spec(path: Path) -> dict[str, Any]:
    return {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}


def _sync() -> Any:
    from nbckpt.engine import Synchronizer, default_client

    return Synchronizer(default_client())


def _start(what: str) -> None:
    """Meet the other processes just before a timed call, as the limit's clock does.

    The parent sends each call to the processes one after another: without this, the
    first to get it would count the wait for the last in its time.
    """
    count = _state["starts"] = _state.get("starts", 0) + 1
    _sync().barrier("bench-start", f"{what}-{count}", timeout_s=120)


def raw_write(directory: str, tag: str) -> float:
    """Write every owned shard as one uncompressed zarr chunk with plain tensorstore.

    For the flat states (``fsdp``, ``replicated``, ``mesh2d``); ``replica_id`` 0 of
    each shard writes it. tensorstore's default context fsyncs every file before a
    write commits. Timed from a barrier after the arrays exist to a barrier after
    every process's writes.
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
            shard = v.sharding.shard_shape(v.shape)
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


# -- the disk's limit for the state's unique bytes: plain files ------------------------

_BLOCK = 16 * 2**20


def _share_path(directory: str) -> Path:
    import jax

    return Path(directory) / f"share-{jax.process_index()}"


def raw_file_write(directory: str, tag: str, direct: bool = False) -> float:
    """Write this process's even share of the state's unique bytes as one plain file.

    ``os.write`` in 16 MiB blocks, ``os.fdatasync`` and an ``fsync`` of the directory,
    timed from a barrier to a barrier after every process's writes: the disk's limit
    for writing each unique byte once per job, whatever the layout (a replicated state
    is written once, split among the processes). With ``direct`` the file is opened
    ``O_DIRECT`` and written from a page-aligned block, no copy into the page cache
    (a tail past the last whole 4 KiB goes through it), as nbckpt writes its large
    chunks on such a disk; where the file system refuses, it is written buffered.
    """
    import mmap

    import numpy as np

    sync = _sync()
    path = _share_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    left = int(_state["unique_owned"])
    # Made before the clock starts: the limit is the disk's, not the generator's. A
    # mapping of its own, so that it starts on a page (what O_DIRECT asks).
    size = min(left, _BLOCK)
    buf = mmap.mmap(-1, max(size, 1))
    buf[:size] = np.random.default_rng(left).bytes(size)
    block = memoryview(buf)[:size]
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    use_direct = direct and hasattr(os, "O_DIRECT")
    sync.barrier("bench-rawfile", f"{tag}-write0", timeout_s=120)
    t0 = time.perf_counter()
    try:
        fd = os.open(path, flags | (os.O_DIRECT if use_direct else 0), 0o644)
    except OSError:
        fd, use_direct = os.open(path, flags, 0o644), False
    try:
        while left > 0:
            n = min(left, len(block))
            if use_direct and n % 4096:
                import fcntl

                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                use_direct = False
            left -= os.write(fd, block[:n])
        os.fdatasync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the new file's entry is part of durability, as for a checkpoint
    finally:
        os.close(dfd)
    sync.barrier("bench-rawfile", f"{tag}-write1", timeout_s=600)
    return time.perf_counter() - t0


def raw_file_read(directory: str, tag: str) -> float:
    """Read this process's share back with plain reads; seconds between two barriers.

    The parent drops the page cache first. The reads reuse one 16 MiB buffer: the
    figure is the disk's limit, without the cost of the memory a restore fills.
    """
    sync = _sync()
    path = _share_path(directory)
    size = int(_state["unique_owned"])
    view = memoryview(bytearray(min(size, _BLOCK)))
    got = 0
    sync.barrier("bench-rawfile", f"{tag}-read0", timeout_s=120)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            got += n
    sync.barrier("bench-rawfile", f"{tag}-read1", timeout_s=600)
    elapsed = time.perf_counter() - t0
    if got != size:
        raise AssertionError(f"read {got} bytes of {path}, wrote {size}")
    return elapsed


# -- barriers -------------------------------------------------------------------------


def barriers(count: int, tag: str, fast_s: float | None = None) -> float:
    """Median round trip of ``count`` nbckpt barriers, seconds.

    ``fast_s`` sets the synchronizer's (0: the key-value form alone).
    """
    sync = _sync()
    if fast_s is not None:
        sync.fast_s = fast_s
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
