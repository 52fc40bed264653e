"""A plain read of a step's own files: what the restore would take with no software.

``compare.py`` times, besides the plain-file limit (one file per process), a plain read
of the files nbckpt wrote for the step (its chunk files and packs), the way a restore
reads a chunk file but with nothing else. nbckpt's restore against it is what the
restore's own work costs (agreement, records, planning, checks, placing); it against
the limit is what the step's files cost (several files per process instead of one).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _workers

#: The folder that holds a step's checksums: records, not data.
_RECORDS = "_CHECKSUMS"


def data_files(step_dir: Path) -> list[tuple[int, str]]:
    """The step's data files (chunk files and packs) as ``(size, path)``, largest first.

    Every file in a folder of the step but its checksums folder, less the arrays'
    metadata (names starting with a dot); the step's own records lie at its top.
    """
    found = []
    for sub in sorted(step_dir.iterdir()):
        if not sub.is_dir() or sub.name == _RECORDS:
            continue
        for f in sorted(sub.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                found.append((f.stat().st_size, str(f)))
    return sorted(found, key=lambda sp: (-sp[0], sp[1]))


def share(files: list[tuple[int, str]], process: int, count: int) -> list[str]:
    """The files ``process`` of ``count`` reads: each file once, bytes evened out.

    Largest first, each to the process with the fewest bytes so far (the lowest index
    on a tie); every process computes the same split.
    """
    loads = [0] * count
    mine = []
    for size, path in files:
        p = min(range(count), key=lambda i: (loads[i], i))
        loads[p] += size
        if p == process:
            mine.append(path)
    return mine


def read_step_files(root: str, step: int, tag: str) -> dict[str, float]:
    """Read this process's share of the step's data files; seconds between two barriers.

    The parent drops the page cache first. The files are read as a restore reads chunk
    files, without its checks and mapping: by
    :data:`~nbckpt.engine.restore.chunkfiles.THREADS` threads at once, each whole file
    a :data:`~nbckpt.engine.restore.chunkfiles.SUM_PIECE` at a time into a buffer of
    its thread's.
    Returns ``seconds``, and the number of ``files`` this process read.
    """
    import jax

    from nbckpt.engine.restore.chunkfiles import SUM_PIECE, THREADS

    files = data_files(Path(root) / str(step))
    mine = share(files, jax.process_index(), jax.process_count())
    chosen = set(mine)
    expected = sum(size for size, path in files if path in chosen)
    buffers = threading.local()

    def read(path: str) -> int:
        view = getattr(buffers, "view", None)
        if view is None:
            view = buffers.view = memoryview(bytearray(SUM_PIECE))
        got = 0
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                got += n
        return got

    sync = _workers._sync()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(read, ["/dev/null"] * THREADS))  # threads up before the clock
        sync.barrier("bench-stepfiles", f"{tag}-0", timeout_s=120)
        t0 = time.perf_counter()
        got = sum(pool.map(read, mine))
        sync.barrier("bench-stepfiles", f"{tag}-1", timeout_s=600)
        seconds = time.perf_counter() - t0
    if got != expected:  # a read cut short would make the baseline look fast
        raise AssertionError(f"read {got} bytes of the step's files, expected {expected}")
    return {"seconds": seconds, "files": len(mine)}
