"""A path in an object store, read and written through a tensorstore kvstore.

:class:`ObjectPath` offers the part of :class:`pathlib.Path` that nbckpt's layout,
journal and readers use (``/``, ``name``, ``parent``, ``exists``, ``iterdir``,
``read_bytes`` …) over the keys of a bucket, so the same code reads a step from a
local disk and from a bucket. A "directory" is a key prefix: it exists while some key
lies under it, and making one is a no-op. Nothing here renames: object stores have no
atomic rename, which is why steps there are published by a commit object.

A backend (``s3://``, ``gs://``) is a subclass that says how to reach its bucket
(:meth:`ObjectPath.bucket_spec`). tensorstore is imported on first use, so the notebook
side can name an object root without it.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nbckpt.errors import StorageError
from nbckpt.storage.backend import RETRIES, RETRY_CONTEXT, UNREACHABLE, Backend

if TYPE_CHECKING:
    import tensorstore as ts

__all__ = ["DEFAULT_TIMEOUT_S", "RETRIES", "RETRY_CONTEXT", "UNREACHABLE", "ObjectPath"]

#: The longest any one request (with the store's own retries) may take before it is
#: reported as a failure of the store.
DEFAULT_TIMEOUT_S = 120.0

_stores: dict[tuple[Any, ...], Any] = {}
_stores_lock = threading.Lock()


def _successor(prefix: str) -> str:
    """The first key after every key that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else ""


class ObjectPath(Backend):
    """A key (or key prefix) in a bucket of an object store.

    What reaches the store (its kvstore spec, retries, how failures are worded) is
    the :class:`~nbckpt.storage.backend.Backend`'s, which each scheme's subclass fills in.

    Parameters
    ----------
    bucket
        The bucket's name.
    key
        The key below the bucket, ``/``-separated; leading and trailing slashes are
        dropped (``""`` is the bucket itself).
    """

    def __init__(self, bucket: str, key: str = "") -> None:
        if not bucket:
            raise ValueError(f"a {self.scheme}:// URL needs a bucket name")
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"'.' and '..' are not allowed in an object key: {key!r}")
        self.bucket = bucket
        self.key = "/".join(parts)

    # -- pure path operations ------------------------------------------------------------

    def _with_key(self, key: str) -> ObjectPath:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.key = key
        return other

    def __truediv__(self, other: str) -> ObjectPath:
        extra = [p for p in str(other).split("/") if p]
        if any(p in (".", "..") for p in extra):
            raise ValueError(f"'.' and '..' are not allowed in an object key: {other!r}")
        return self._with_key("/".join([self.key, *extra]) if self.key else "/".join(extra))

    @property
    def name(self) -> str:
        """The last segment of the key (``""`` for the bucket)."""
        return self.key.rsplit("/", 1)[-1] if self.key else ""

    @property
    def parent(self) -> ObjectPath:
        """The prefix one level up (the bucket's parent is the bucket)."""
        return self._with_key(self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    @property
    def stem(self) -> str:
        """The name without its last suffix."""
        name = self.name
        return name.rsplit(".", 1)[0] if "." in name[1:] else name

    def with_name(self, name: str) -> ObjectPath:
        """This path with its last segment replaced."""
        if not self.key:
            raise ValueError(f"{self} has no name to replace")
        return self.parent / name

    def relative_to(self, other: ObjectPath) -> str:
        """This key relative to ``other``'s (``ValueError`` if not below it)."""
        if type(other) is not type(self) or other.bucket != self.bucket:
            raise ValueError(f"{self} is not under {other}")
        if not other.key:
            return self.key
        if self.key == other.key:
            return ""
        if not self.key.startswith(other.key + "/"):
            raise ValueError(f"{self} is not under {other}")
        return self.key[len(other.key) + 1 :]

    def absolute(self) -> ObjectPath:
        """Itself: an object path is always absolute."""
        return self

    def is_symlink(self) -> bool:
        """False: object stores have no links."""
        return False

    def __str__(self) -> str:
        return (
            f"{self.scheme}://{self.bucket}/{self.key}"
            if self.key
            else (f"{self.scheme}://{self.bucket}")
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and isinstance(other, ObjectPath)
            and (other.bucket, other.key) == (self.bucket, self.key)
        )

    def __hash__(self) -> int:
        return hash((self.scheme, self.bucket, self.key))

    def __lt__(self, other: ObjectPath) -> bool:
        return str(self) < str(other)

    # -- the store -----------------------------------------------------------------------

    def kvstore_spec(self) -> dict[str, Any]:
        """The tensorstore kvstore spec of this prefix (a "directory": ends in ``/``)."""
        return {**self.bucket_spec(), "path": f"{self.key}/" if self.key else ""}

    def _store(self) -> ts.KvStore:
        import tensorstore as ts

        spec = self.bucket_spec()
        # The endpoint too: GCS's comes from the environment, not the spec, and a store
        # opened for one address must not answer for another.
        ident = (type(self).__name__, self.endpoint, repr(sorted(spec.items())))
        with _stores_lock:
            store = _stores.get(ident)
            if store is None:
                context = ts.Context(self.context_spec())
                store = ts.KvStore.open(spec, context=context).result(timeout=DEFAULT_TIMEOUT_S)
                _stores[ident] = store
        return store

    def _call(self, action: str, fn: Any) -> Any:
        """Run one request ``fn(store)``; turn the store's failure into a StorageError.

        Opening the store is inside too: a bad bucket name or endpoint fails there.
        """
        try:
            return fn(self._store()).result(timeout=DEFAULT_TIMEOUT_S)
        except StorageError:
            raise
        except (ValueError, TimeoutError, OSError) as e:
            reason = self.classify(e)
            raise StorageError(str(self), action, reason, self.advice(reason)) from e

    def _keys(self, prefix: str, *, exact: bool = False) -> list[str]:
        """The keys that start with ``prefix`` (``exact``: only ``prefix`` itself)."""
        import tensorstore as ts

        span = _exact(prefix) if exact else ts.KvStore.KeyRange(prefix, _successor(prefix))
        found = self._call("list", lambda store: store.list(span))
        return [k.decode("utf-8", "surrogateescape") for k in found]

    def list_keys(self) -> list[str]:
        """Every key under this prefix, relative to it, sorted."""
        prefix = f"{self.key}/" if self.key else ""
        return sorted(k[len(prefix) :] for k in self._keys(prefix))

    def read_bytes(self) -> bytes:
        """The object's contents (``FileNotFoundError`` if there is no such object)."""
        result = self._call("read", lambda store: store.read(self.key))
        if result.state != "value":
            # tensorstore reads a missing bucket as a missing key; a listing tells them
            # apart (and raises StorageError for the bucket).
            self._keys(self.key, exact=True)
            raise FileNotFoundError(f"no object {self}")
        return bytes(result.value)

    def read_text(self, encoding: str = "utf-8") -> str:
        """The object's contents, decoded."""
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """Store ``data`` under this key; on return the store has acknowledged it."""
        self._call("write", lambda store: store.write(self.key, data))
        return len(data)

    def create_exclusive(self, data: bytes) -> bool:
        """Store ``data`` under this key only if no object has it; tell whether it did.

        A conditional write: its condition is that the key holds no object. tensorstore
        sends it as the store's own condition (``If-None-Match: *`` on S3) to AWS
        endpoints, or to any endpoint when ``TENSORSTORE_S3_USE_CONDITIONAL_WRITE=1``;
        elsewhere it checks the key first, which narrows a race between two creators
        without closing it.
        """
        found = self._call("read", lambda store: store.read(self.key))
        if found.state == "value":
            return False
        absent = found.stamp.generation
        stamp = self._call("write", lambda store: store.write(self.key, data, if_equal=absent))
        # A condition that did not hold leaves the object alone and no generation.
        return bool(stamp.generation)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        """Store ``text`` under this key (see :meth:`write_bytes`)."""
        return self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        """Delete this object (deleting a missing object is not an error)."""
        # One DELETE request. A one-key range is a listing and then a DELETE: deleting
        # the 1,024 records of a journal summary took twice as long on S3 (moto) that way.
        self._call("delete", lambda store: store.write(self.key, None))

    def is_file(self) -> bool:
        """Whether an object has exactly this key."""
        return bool(self.key) and bool(self._keys(self.key, exact=True))

    def is_dir(self) -> bool:
        """Whether some object lies under this prefix."""
        return bool(self._keys(f"{self.key}/" if self.key else ""))

    def exists(self) -> bool:
        """Whether this is an object or a non-empty prefix."""
        return not self.key or self.is_file() or self.is_dir()

    def iterdir(self) -> Iterator[ObjectPath]:
        """The names one level below this prefix, objects and prefixes alike, sorted."""
        names = {k.split("/", 1)[0] for k in self.list_keys() if k}
        return iter([self / n for n in sorted(names)])

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """The children whose name matches ``pattern`` (one level, no ``**``)."""
        return iter([p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)])

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a prefix exists once an object is written under it."""

    def remove_tree(self) -> None:
        """Delete every object under this prefix, and the object of this key."""
        import tensorstore as ts

        if not self.key:
            raise ValueError(f"refusing to delete every object of {self}")
        prefix = f"{self.key}/"
        whole = ts.KvStore.KeyRange(prefix, _successor(prefix))
        self._call("delete", lambda store: store.delete_range(whole))
        self.unlink(missing_ok=True)


def _exact(key: str) -> Any:
    import tensorstore as ts

    return ts.KvStore.KeyRange(key, key + "\x00")
