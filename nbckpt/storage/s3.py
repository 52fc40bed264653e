"""``s3://bucket/prefix`` roots, on AWS or any S3-compatible store.

Reached through tensorstore's ``s3`` kvstore driver, configured the way the AWS tools
are, so the same code reaches AWS, MinIO, Ceph or GCS's S3 interface:

- ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``: the store's address (unset: AWS);
- ``AWS_REGION`` or ``AWS_DEFAULT_REGION``: its region;
- credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and
  ``AWS_SESSION_TOKEN``) when set, else tensorstore's default chain (``AWS_PROFILE``,
  ``~/.aws/credentials``, instance metadata).

The environment is read when a path is made, so each process uses its own.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from nbckpt.storage.backend import RETRIES
from nbckpt.storage.objects import ObjectPath

__all__ = ["RETRIES", "S3Path", "s3_settings"]


def s3_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The endpoint, region and kind of credentials the environment gives.

    Parameters
    ----------
    env
        The environment to read (``os.environ`` by default).

    Returns
    -------
    dict
        ``endpoint`` (or None for AWS), ``region`` (or None), ``credentials``:
        ``"environment"`` or ``"default"``, and ``credential_source``: where the
        credentials come from (a variable or a file), or None if nothing names any.
    """
    env = dict(os.environ if env is None else env)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    keys = bool(env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))
    return {
        "endpoint": endpoint.rstrip("/") if endpoint else None,
        "region": region,
        "credentials": "environment" if keys else "default",
        "credential_source": _credential_source(env) if not keys else "environment",
    }


def _credential_source(env: dict[str, str]) -> str | None:
    """Where the default chain would find credentials, short of asking a metadata server.

    None when nothing names any: no profile, no credentials or config file, no web
    identity or container credentials. Instance metadata (EC2) may still answer then,
    so this only explains a failure; it refuses nothing.
    """
    for name in (
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        if env.get(name):
            return name
    home = os.path.expanduser("~")
    for name, default in (
        ("AWS_SHARED_CREDENTIALS_FILE", os.path.join(home, ".aws", "credentials")),
        ("AWS_CONFIG_FILE", os.path.join(home, ".aws", "config")),
    ):
        if os.path.isfile(env.get(name) or default):
            return env.get(name) or default
    return None


class S3Path(ObjectPath):
    """A key or prefix in an S3 bucket: ``S3Path("bucket", "ckpt/run1")``."""

    scheme: ClassVar[str] = "s3"
    driver: ClassVar[str] = "s3"
    credentials_hint: ClassVar[str] = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
    endpoint_variable: ClassVar[str] = "AWS_ENDPOINT_URL"

    def __init__(self, bucket: str, key: str = "") -> None:
        super().__init__(bucket, key)
        self.settings = s3_settings()

    @property
    def endpoint(self) -> str:
        """The address requests go to."""
        return self.settings["endpoint"] or "AWS"

    def bucket_spec(self) -> dict[str, Any]:
        """The ``s3`` kvstore of the bucket, with the endpoint and region configured."""
        spec: dict[str, Any] = {
            "driver": "s3",
            "bucket": self.bucket,
            "aws_credentials": {"type": self.settings["credentials"]},
        }
        if self.settings["endpoint"]:
            spec["endpoint"] = self.settings["endpoint"]
        if self.settings["region"]:
            spec["aws_region"] = self.settings["region"]
        return spec

    def context_spec(self) -> dict[str, Any]:
        """Bounded retries with backoff, so a dead store fails in seconds, not minutes."""
        return {"s3_request_retries": RETRIES}

    def classify(self, exc: BaseException) -> str:
        """Name the failure the way a user can act on it."""
        text = str(exc)
        if self.unreachable(exc):
            return f"the store at {self.endpoint} did not answer"
        if "NoSuchBucket" in text:
            return f"bucket {self.bucket!r} does not exist"
        for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken"):
            if code in text:
                return f"the store refused the credentials ({code})"
        if "PERMISSION_DENIED" in text or "UNAUTHENTICATED" in text:
            return "the store refused the credentials"
        if self.settings["credential_source"] is None and "retry attempts failed" in text:
            # What tensorstore says when its default chain found no credentials
            # ("All 6 retry attempts failed: Unknown"), after every retry.
            return "no S3 credentials were found in this process's environment"
        if "SlowDown" in text or "RESOURCE_EXHAUSTED" in text:
            return "the store kept throttling requests (SlowDown)"
        return super().classify(exc)

    def advice(self, reason: str) -> str:
        """What the user should check for each kind of failure."""
        if "did not answer" in reason:
            return "check AWS_ENDPOINT_URL and that the store is up"
        if "no S3 credentials" in reason:
            return (
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) where "
                "the request runs: the kernel, or every engine"
            )
        if "credentials" in reason:
            return "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
        return super().advice(reason)
