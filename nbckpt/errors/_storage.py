"""Storage errors: the store under the root refused or failed a request."""

from __future__ import annotations

from nbckpt.errors._base import StorageAccessError

__all__ = ["RootNotWritableError", "StorageError"]


class StorageError(StorageAccessError, OSError):
    """A request to the store holding the root failed (after the store's own retries).

    Parameters
    ----------
    url
        The object or prefix the request was about.
    action
        ``"read"``, ``"write"``, ``"list"`` or ``"delete"``.
    reason
        Why, in a few words (e.g. ``bucket 'ck' does not exist``).
    advice
        What to do about it.
    """

    def __init__(self, url: str, action: str, reason: str, advice: str) -> None:
        self.url = url
        self.action = action
        self.reason = reason
        super().__init__(f"{action} of {url} failed: {reason}; {advice}")


class RootNotWritableError(StorageAccessError, PermissionError):
    """The checkpoint root cannot be created or written by some process."""

    def __init__(self, root: str, process: int, reason: str) -> None:
        self.root = root
        self.process = process
        self.reason = reason
        super().__init__(
            f"checkpoint root {root} is not writable from process {process} ({reason}); "
            "choose a directory every process can write, nothing was saved"
        )
