"""What differs between object stores: how to reach a bucket, and how its failures read.

:class:`Backend` is the part of :class:`~nbckpt.storage.objects.ObjectPath` that each
scheme (``s3://``, ``gs://``) fills in: the tensorstore kvstore spec of its bucket, the
context resources its requests use, where requests go and where credentials come
from, and how a failed request is worded for the user. Nothing here makes a request.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["RETRIES", "RETRY_CONTEXT", "UNREACHABLE", "Backend"]

#: Retries of a failed or throttled request (HTTP 5xx, 429, ``SlowDown``), with a delay
#: that doubles from ``initial_delay`` up to ``max_delay``: about 13 s in all before a
#: request is reported as failed.
RETRIES: dict[str, Any] = {"max_retries": 6, "initial_delay": "0.2s", "max_delay": "5s"}

#: The tensorstore context resources that bound every object store's retries; part of
#: each context nbckpt opens arrays in.
RETRY_CONTEXT: dict[str, Any] = {"s3_request_retries": RETRIES, "gcs_request_retries": RETRIES}

#: What tensorstore's (curl's) errors say when a store cannot be reached or answers
#: nothing.
UNREACHABLE = (
    "UNAVAILABLE",
    "Connection refused",
    "connect to server",
    "Failed to connect",
    "Empty reply from server",  # it took the connection, then closed it
    "Server returned nothing",
)


class Backend:
    """How one object store is reached and how its failures read (see the module)."""

    #: The URL scheme, e.g. ``"s3"``.
    scheme: ClassVar[str] = ""
    #: tensorstore's kvstore driver for it, e.g. ``"gcs"``.
    driver: ClassVar[str] = ""
    #: How a user gives this store's credentials to a process, for messages.
    credentials_hint: ClassVar[str] = ""
    #: The variable that points a process at another server than the cloud's.
    endpoint_variable: ClassVar[str] = ""

    def bucket_spec(self) -> dict[str, Any]:
        """The tensorstore kvstore spec of the whole bucket (without ``path``)."""
        raise NotImplementedError

    def context_spec(self) -> dict[str, Any]:
        """The tensorstore context resources this backend's requests use."""
        return {}

    @property
    def endpoint(self) -> str:
        """The address requests go to, for messages."""
        return f"{self.scheme}://"

    @property
    def credential_source(self) -> str | None:
        """Where this process's credentials for the store come from; None if nowhere."""
        settings: dict[str, Any] = getattr(self, "settings", {})
        source: str | None = settings.get("credential_source")
        return source

    def advice(self, reason: str) -> str:
        """What to do about a failure whose reason :meth:`classify` gave.

        What every store shares; a subclass says what is its own (where its endpoint
        and credentials are set) and falls back to this.
        """
        if "does not exist" in reason:
            return "create the bucket or fix the URL"
        if "throttling" in reason:
            return "save less often or to another prefix, then retry"
        return "check the store and try again"

    def failed_request(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by tensorstore) is a request to this store that failed.

        A timeout, an HTTP exchange (a status, curl's error), a connection that failed
        or got no answer, or an error about a spec of this store's driver; anything
        else (a dtype, a shape) is not the store's.
        """
        text = str(exc)
        marks = ("http_response_code", "CURL", f'"driver":"{self.driver}"', *UNREACHABLE)
        return isinstance(exc, TimeoutError) or any(m in text for m in marks)

    def unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store could not be reached, or did not answer."""
        return isinstance(exc, TimeoutError) or any(m in str(exc) for m in UNREACHABLE)

    def classify(self, exc: BaseException) -> str:
        """Say in a few words why a request failed."""
        return str(exc).split("[", 1)[0].strip() or type(exc).__name__
