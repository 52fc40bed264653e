"""The Method paragraph of ``benchmarks/RESULTS.md``: how ``compare.py`` measured."""

from __future__ import annotations


def method(processes: int, warmup: int, drop_cache: str) -> str:
    """What a run did, in one paragraph.

    ``warmup`` is the untimed repetitions of each state; ``drop_cache`` names the
    function that dropped the page cache before every read.
    """
    return (
        f"{processes} local JAX processes x 1 CPU device joined by jax.distributed. "
        "The states, with random values: `fsdp`, 8 float32 arrays sharded on their first "
        "axis over all devices (the state of the first table); `replicated`, the same "
        'arrays whole on every device; `mesh2d`, a ("data", "model") mesh of shape '
        '(2, n/2) ((1, n) for an odd n), leaves alternating between `P("data", "model")` and '
        '`P(None, "model")`; `small`, a nested optimizer-like tree: six large `fsdp` '
        "leaves, 384 replicated leaves of 1-64 KiB, 0-d arrays and Python scalars; "
        "`transformer`, a 12-layer transformer's parameters and AdamW `mu` and `nu` "
        "(embedding, per layer four FSDP-sharded matrices, four biases and two layer norms "
        "replicated, 442 leaves); `many`, the same with 111 layers (4,006 leaves). Per "
        "repetition, forward and backward in turns (the order below, then its reverse, "
        "so that neither nbckpt nor Orbax runs right after the other): nbckpt "
        "(`AsyncCheckpointer.save` + `wait_until_finished`, restore into the same "
        "shardings), the plain-file limit (each unique byte written once, split evenly "
        "among the processes, `fdatasync`'d, and read back, timed "
        "between two barriers; the write is, of a buffered one and an `O_DIRECT` one made "
        "in turns, the one with the lower median over the repetitions), for `fsdp` raw "
        "tensorstore (one uncompressed zarr chunk per shard, fsync'd, timed between two "
        "barriers) and a `dd`-like single-stream write + `fdatasync` from the parent, and Orbax "
        "(`ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())`, its durable "
        "defaults: OCDBT, zstd, fsync). "
        + (
            ("One warm-up repetition" if warmup == 1 else f"{warmup} warm-up repetitions")
            + " of all of these per state, in the reverse order, ran first; their times "
            "are not counted (their peak memory is): on this VM a first use of memory "
            "its host took back is slow, and it fell on whoever ran first (nbckpt's "
            "first restore of the 1 GiB `fsdp` state took 1.5-1.6 s in two runs, the "
            "others about 0.6 s). "
            if warmup
            else "No warm-up repetition. "
        )
        + "Every timed call starts at a barrier of the "
        "processes, as the limit's do. After each run its files are "
        "deleted and `sync`ed. nbckpt and Orbax each save with one checkpointer per "
        "process kept over the repetitions, as a training loop does (nbckpt keeps its "
        "staging buffers, and any host copies, from its last save). The page cache is dropped "
        f"(`{drop_cache}`) before every read. Figures are medians "
        "over repetitions of the slowest process."
    )
