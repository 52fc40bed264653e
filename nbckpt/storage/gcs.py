"""``gs://bucket/prefix`` roots, on Google Cloud Storage.

Reached through tensorstore's ``gcs`` kvstore driver (GCS's JSON API), configured the
way Google's own tools are:

- credentials: tensorstore's chain, in this order: ``GOOGLE_APPLICATION_CREDENTIALS``
  (a service account's or a user's JSON key file), gcloud's application default
  credentials (``gcloud auth application-default login``, in ``CLOUDSDK_CONFIG`` or
  ``~/.config/gcloud``), the metadata server on a Google Cloud VM; with none of
  them, requests go unauthenticated (a public bucket can still be read);
- ``TENSORSTORE_GCS_HTTP_URL``: another address than ``https://storage.googleapis.com``
  (an emulator such as fake-gcs-server, which also needs
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` set to any token);
- a "Requester Pays" bucket is not supported yet.

Every write is one request acknowledged by the store, and steps are published by a
commit object, as on S3. A conditional write (the ownership record of a step) is sent
as ``ifGenerationMatch=0``, which GCS itself honours: two creators of one record never
both succeed. The environment is read when a path is made, so each process uses its
own.

One difference from S3: tensorstore reads a missing bucket as an empty one (GCS answers
404 to both). Writing to it names the bucket; reading from it finds no steps.
"""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar

from nbckpt.storage.backend import RETRIES
from nbckpt.storage.objects import ObjectPath

__all__ = ["GCSPath", "gcs_settings"]

#: GCS's bucket names: 3-63 lowercase letters, digits, ``-``, ``_`` and ``.``,
#: starting and ending with a letter or a digit (names with dots may be longer, but
#: tensorstore refuses them too).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")

_DEFAULT_ENDPOINT = "https://storage.googleapis.com"


def gcs_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The endpoint and the credentials the environment gives.

    Parameters
    ----------
    env
        The environment to read (``os.environ`` by default).

    Returns
    -------
    dict
        ``endpoint`` (or None for Google's), and ``credential_source``: the variable or
        file tensorstore will take credentials from, or None when nothing names any
        (then the metadata server on a Google Cloud VM, else no credentials at all).
    """
    env = dict(os.environ if env is None else env)
    endpoint = env.get("TENSORSTORE_GCS_HTTP_URL") or None
    return {
        "endpoint": endpoint.rstrip("/") if endpoint else None,
        "credential_source": _credential_source(env),
    }


def _credential_source(env: dict[str, str]) -> str | None:
    """Where tensorstore's chain will find credentials, short of asking a metadata server."""
    if env.get("GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        return "GOOGLE_AUTH_TOKEN_FOR_TESTING"
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return "GOOGLE_APPLICATION_CREDENTIALS"
    home = os.path.expanduser("~")
    config = env.get("CLOUDSDK_CONFIG") or os.path.join(home, ".config", "gcloud")
    adc = os.path.join(config, "application_default_credentials.json")
    return adc if os.path.isfile(adc) else None


class GCSPath(ObjectPath):
    """A key or prefix in a Google Cloud Storage bucket: ``GCSPath("bucket", "ckpt/run1")``."""

    scheme: ClassVar[str] = "gs"
    driver: ClassVar[str] = "gcs"
    credentials_hint: ClassVar[str] = (
        "GOOGLE_APPLICATION_CREDENTIALS (or gcloud's application default credentials)"
    )
    endpoint_variable: ClassVar[str] = "TENSORSTORE_GCS_HTTP_URL"

    def __init__(self, bucket: str, key: str = "") -> None:
        if bucket and not _BUCKET.fullmatch(bucket):
            raise ValueError(
                f"{bucket!r} is not a GCS bucket name (3 to 63 lowercase letters, digits, "
                "'-', '_' and '.', starting and ending with a letter or digit)"
            )
        super().__init__(bucket, key)
        self.settings = gcs_settings()

    @property
    def endpoint(self) -> str:
        """The address requests go to."""
        return self.settings["endpoint"] or _DEFAULT_ENDPOINT

    def bucket_spec(self) -> dict[str, Any]:
        """The ``gcs`` kvstore of the bucket."""
        return {"driver": "gcs", "bucket": self.bucket}

    def context_spec(self) -> dict[str, Any]:
        """Bounded retries with backoff, so a dead store fails in seconds, not minutes."""
        return {"gcs_request_retries": RETRIES}

    def classify(self, exc: BaseException) -> str:
        """Name the failure the way a user can act on it."""
        text = str(exc)
        if self.unreachable(exc):
            return f"the store at {self.endpoint} did not answer"
        if "NOT_FOUND" in text or "http_response_code='404'" in text:
            # Reads of a missing object are not errors; a 404 that is one is the bucket.
            return f"bucket {self.bucket!r} does not exist"
        refused = ("UNAUTHENTICATED", "PERMISSION_DENIED", "code='401'", "code='403'")
        if any(m in text for m in refused):
            if self.settings["credential_source"] is None:
                return "no Google credentials were found in this process's environment"
            return "the store refused the credentials"
        if "RESOURCE_EXHAUSTED" in text or "code='429'" in text:
            return "the store kept throttling requests (429)"
        return super().classify(exc)

    def advice(self, reason: str) -> str:
        """What the user should check for each kind of failure."""
        if "did not answer" in reason:
            return "check TENSORSTORE_GCS_HTTP_URL (if set) and the network"
        if "no Google credentials" in reason:
            return (
                'run "gcloud auth application-default login" or set '
                "GOOGLE_APPLICATION_CREDENTIALS where the request runs: the kernel, "
                "or every engine"
            )
        if "credentials" in reason:
            return "check that the account of GOOGLE_APPLICATION_CREDENTIALS may use the bucket"
        return super().advice(reason)
