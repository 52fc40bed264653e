"""Chunk checksums: the one implementation the writer, restore and fsck share.

Every process of a save records the checksum of every chunk it writes in
``<step>/_CHECKSUMS/process_<i>.json``::

    {"#algorithm": "crc32c", "<leaf name>": {"<zarr chunk key>": <uint32>, ...}, ...}

The checksum is taken over the chunk's bytes in C order (for nbckpt's uncompressed zarr
arrays, the chunk file's bytes). New saves use CRC-32C, which current CPUs compute in
hardware (the ``google-crc32c`` package), several times faster than zlib's CRC-32, so a
restore can check every chunk it reads at close to full speed. Files written before
the algorithm was recorded have no ``"#algorithm"`` entry and hold zlib CRC-32 values.
``"#algorithm"`` can never be a leaf name: leaf names percent-encode ``#``.

A step may be local or in an object store (:mod:`nbckpt.storage`). This module needs
neither jax nor tensorstore (an object store's requests import tensorstore when made):
fsck uses it on the notebook side.
"""

from __future__ import annotations

import ctypes
import json
import os
import zlib
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from nbckpt import storage
from nbckpt.formats.layout import CHECKSUMS_DIR
from nbckpt.formats.packs import PACK_KEY, PackIndex, parse_pack
from nbckpt.pools import LazyPool

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_KEY",
    "CRC32",
    "CRC32C",
    "Recorded",
    "checksum",
    "crc32c_extend",
    "default_algorithm",
    "fast_crc32c",
    "matches",
    "read_checksums",
]

#: zlib's CRC-32: what steps saved before CRC-32C hold (no algorithm recorded).
CRC32 = "crc32"
#: CRC-32C (Castagnoli), computed in hardware: what new saves record.
CRC32C = "crc32c"
ALGORITHMS = (CRC32, CRC32C)
#: The entry of a checksums file that names its algorithm.
ALGORITHM_KEY = "#algorithm"

#: Leaf name -> zarr chunk key -> (algorithm, checksum), merged over every process.
Recorded = dict[str, dict[str, tuple[str, int]]]

#: Reads the checksums files of a step (see :func:`read_checksums`), kept from one
#: step to the next: making the threads anew cost a restore more than reading them.
_reading = LazyPool(16, "nbckpt-read-sums")

#: Pieces for the copying CRC-32C fallback: each copy stays small and, being at least
#: 1 MiB, lets google_crc32c release the GIL while it runs.
_PIECE = 4 << 20


@cache
def _crc32c_impl() -> tuple[Callable[[int, np.ndarray], int] | None, bool, bool]:
    """Return (CRC-32C extending a CRC by an array's bytes, is it fast, is it in place).

    The function is None when ``google_crc32c`` is not installed. Its Python API takes
    only ``bytes`` (a NumPy buffer is refused), which would cost a copy of every chunk;
    so its C library is called through ctypes instead: no copy, and ctypes releases the
    GIL for the call. Where that symbol cannot be found, the API is used on copies.
    """
    try:
        import google_crc32c
    except ImportError:
        return None, False, False
    fast = google_crc32c.implementation == "c"
    if fast:
        try:
            from google_crc32c import _crc32c

            # dlsym through the extension's handle also searches the libraries it links,
            # which is where the (bundled) libcrc32c defines crc32c_extend.
            lib = ctypes.CDLL(_crc32c.__file__)
            extend = lib.crc32c_extend
            extend.restype = ctypes.c_uint32
            extend.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
            if extend(0, b"123456789", 9) == 0xE3069283:  # the standard check value

                def direct(crc: int, flat: np.ndarray) -> int:
                    return int(extend(crc, flat.ctypes.data, flat.nbytes))

                return direct, True, True
        except (ImportError, OSError, AttributeError):
            pass

    def copying(crc: int, flat: np.ndarray) -> int:
        for start in range(0, flat.nbytes, _PIECE):
            crc = google_crc32c.extend(crc, flat[start : start + _PIECE].tobytes())
        return int(crc)

    return copying, fast, False


def fast_crc32c() -> bool:
    """Tell whether CRC-32C is computed by compiled code here (else saves use CRC-32)."""
    return _crc32c_impl()[1]


def crc32c_extend() -> Callable[[int, np.ndarray], int] | None:
    """Return ``extend(crc, flat)``: CRC-32C of ``crc`` extended by a flat uint8 array.

    None unless CRC-32C is computed in place by compiled code (no copy, GIL released):
    what a restore uses to checksum each piece of a chunk as it reads it, while the
    piece is still in the CPU's cache (:mod:`nbckpt.engine.restore.chunkfiles`).
    """
    impl, _fast, in_place = _crc32c_impl()
    return impl if in_place else None


def default_algorithm() -> str:
    """Return the algorithm a new save records: CRC-32C where it is fast, else CRC-32.

    CRC-32C needs ``google-crc32c`` (part of the ``engine`` extra); without its compiled
    extension, a save falls back to zlib's CRC-32, which it records as such.
    """
    return CRC32C if fast_crc32c() else CRC32


def _flat_bytes(data: Any) -> np.ndarray:
    """Return ``data``'s bytes in C order as a flat uint8 array (a view when possible)."""
    arr = np.ascontiguousarray(data)  # copies only a strided view
    return arr.reshape(-1).view(np.uint8)


def checksum(data: Any, algorithm: str) -> int:
    """Return the checksum of an array's (or buffer's) bytes in C order.

    Parameters
    ----------
    data
        A NumPy array (any dtype, any strides), ``bytes`` or another buffer.
    algorithm
        :data:`CRC32C` or :data:`CRC32`.

    Raises
    ------
    ValueError
        If the algorithm is unknown.
    ImportError
        If it is CRC-32C and ``google-crc32c`` is not installed.
    """
    flat = _flat_bytes(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data)
    if algorithm == CRC32C:
        impl, _fast, _in_place = _crc32c_impl()
        if impl is None:
            raise ImportError(
                "CRC-32C checksums need the google-crc32c package: "
                "pip install 'google-crc32c>=1.5' (or nbckpt[engine])"
            )
        return impl(0, flat)
    if algorithm == CRC32:
        return zlib.crc32(flat.data)  # zlib releases the GIL on large buffers
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def matches(data: np.ndarray, algorithm: str, expected: int) -> bool:
    """Tell whether a chunk read back matches the checksum recorded for it.

    The chunk's bytes in C order must give ``expected``; or, for a dtype of several
    bytes, the same bytes swapped within each element must: saves made before nbckpt
    stored NumPy arrays in native byte order recorded the checksum of a non-native
    (big-endian) array's own bytes while storing its values in native order. Such a
    step's data is intact, and is read as such.

    Raises
    ------
    ValueError, ImportError
        As :func:`checksum`.
    """
    if checksum(data, algorithm) == expected:
        return True
    if data.dtype.itemsize > 1 and data.dtype.kind in "iufc":
        return checksum(data.byteswap(), algorithm) == expected
    return False


def read_checksums(
    step_path: str | os.PathLike[str] | storage.Location, packs: PackIndex | None = None
) -> Recorded | None:
    """Read and merge the checksums every process recorded for a step.

    ``packs``, if given, receives where each packed chunk lies (the files' ``"#packed"``
    entries, see :mod:`nbckpt.formats.packs`).

    Returns
    -------
    Recorded or None
        ``{leaf: {chunk key: (algorithm, value)}}``; None when the step holds no
        checksums file (it was saved without checksums, so there is nothing to verify).

    Raises
    ------
    OSError
        If a checksums file cannot be read (:class:`~nbckpt.errors.StorageError` if the
        store failed the request).
    ValueError
        If one is not valid JSON of the expected shape, or names an unknown algorithm.
    """
    where = storage.location(step_path) / CHECKSUMS_DIR
    files = storage.glob(where, "process_*.json")
    if not files:
        return None
    # One request per process's file; on an object store each is a round trip, so they
    # are all in flight at once (at most 16), on threads kept for the next step's.
    texts = list(_reading.get().map(lambda f: f.read_text(encoding="utf-8"), files))
    merged: Recorded = {}
    for path, text in zip(files, texts, strict=True):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        algorithm = data.pop(ALGORITHM_KEY, CRC32)  # none recorded: written before CRC-32C
        pack = data.pop(PACK_KEY, None)
        if pack is not None:
            parse_pack(pack, str(path), packs if packs is not None else {})
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"{path} uses checksum algorithm {algorithm!r}, which this nbckpt does not "
                "know (written by a newer version?)"
            )
        for leaf, chunks in data.items():
            if not isinstance(chunks, dict):
                raise ValueError(f"{path}: the checksums of leaf {leaf!r} are malformed")
            into = merged.setdefault(leaf, {})
            # Checked inline, once per chunk: a state of thousands of leaves has tens of
            # thousands of chunks over its processes' files.
            for key, value in chunks.items():
                if not isinstance(value, int) or not 0 <= value < 2**32:
                    raise ValueError(f"{path}: the checksums of leaf {leaf!r} are malformed")
                into[key] = (algorithm, value)
    return merged
