"""Host-shared regions of a replicated leaf, in one process on a real tmpfs.

Two :class:`HostRegion` objects with the same tag play two holders on one host; the
multihost tests (``test_multihost.py``) run the same with four real processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nbckpt.engine.restore import hostshare
from nbckpt.engine.restore.hostshare import HostRegion, slab_rows


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 64, 1000])
@pytest.mark.parametrize("holders", [1, 2, 3, 4, 8])
def test_slabs_cover_every_row_once_in_contiguous_runs(rows: int, holders: int) -> None:
    slabs = [slab_rows(rows, holders, r) for r in range(holders)]
    assert [i for s in slabs for i in s] == list(range(rows))
    sizes = [len(s) for s in slabs]
    assert max(sizes) - min(sizes) <= 1


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Regions in ``/dev/shm`` when this machine has it, as in real use."""
    where = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    saved = hostshare.SCRATCH_DIR
    hostshare.SCRATCH_DIR = where
    try:
        yield where
    finally:
        hostshare.SCRATCH_DIR = saved


def _holders(tag: str, shape: tuple[int, ...], n: int) -> list[HostRegion]:
    return [HostRegion(tag, shape, np.dtype(np.float32), r, n) for r in range(n)]


def test_holders_fill_their_slabs_and_each_adopts_a_private_copy(scratch: Path) -> None:
    tag = f"test-{os.getpid()}-fill"
    shape, chunk_rows = (100, 30), 16
    want = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    regions = _holders(tag, shape, 3)
    assert regions[0].path == regions[1].path and regions[0].path.parent == scratch
    for region in regions:
        start, stop = region.slab(slab_rows(7, 3, region.rank), chunk_rows)
        region.buffer()[start:stop] = want[start:stop]
        region.mark()
    adopted = [region.adopt() for region in regions]
    for region in regions:
        region.close()
    assert not regions[0].path.exists()
    for got in adopted:
        assert got is not None
        np.testing.assert_array_equal(got, want)
    # Copy-on-write: one holder changing its array leaves the others' alone.
    assert adopted[0] is not None and adopted[1] is not None
    adopted[0][:] = -1
    np.testing.assert_array_equal(adopted[1], want)


def test_a_missing_slab_makes_adopt_decline(scratch: Path) -> None:
    regions = _holders(f"test-{os.getpid()}-missing", (8, 4), 2)
    regions[0].slab(slab_rows(8, 2, 0), 1)
    regions[0].mark()  # holder 1 never marks: it read the region itself
    try:
        assert regions[0].adopt() is None
    finally:
        for region in regions:
            region.close()
        regions[0].close()  # idempotent


def test_no_room_means_the_ordinary_read(tmp_path: Path) -> None:
    saved = hostshare.SCRATCH_DIR
    hostshare.SCRATCH_DIR = tmp_path / "absent"
    try:
        assert not hostshare.usable(1)
        with pytest.raises(OSError):
            HostRegion("test-absent", (4,), np.dtype(np.float32), 0, 2)
    finally:
        hostshare.SCRATCH_DIR = saved
    hostshare.SCRATCH_DIR = tmp_path
    try:
        assert not hostshare.usable(1 << 62)  # more than any disk holds
    finally:
        hostshare.SCRATCH_DIR = saved
