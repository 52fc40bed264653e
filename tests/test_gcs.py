"""``gs://`` roots: what only Google Cloud Storage shows, against fake-gcs-server.

The tests every object store passes run against fake-gcs-server in
``test_object_stores.py``. Here: GCS's URLs and bucket names, where credentials come
from, a store that cannot be reached, a missing bucket read (which GCS answers like an
empty one), and the server routes the sidebar reads a ``gs://`` root through.

fake-gcs-server checks no credentials, so a refused token cannot be shown against it:
how such an answer is worded is tested on the error text tensorstore gives for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from nbckpt import storage
from nbckpt.engine import AsyncCheckpointer
from nbckpt.errors import PeerFailedError, StepNotFoundError, StorageURLError
from nbckpt.storage import GCSPath
from nbckpt.storage.gcs import gcs_settings
from nbckpt.storage.local_gcs import GCSServer
from nbckpt.storage.local_server import closed_port
from tests.ckpt_fixtures import api_get


@pytest.fixture(scope="module")
def gcs() -> Iterator[GCSServer]:
    with GCSServer() as server:
        yield server


@pytest.fixture
def root(gcs: GCSServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with this process's environment pointing at the server."""
    name = f"ck-{uuid.uuid4().hex[:10]}"
    gcs.create_bucket(name)
    for key, value in gcs.env().items():
        monkeypatch.setenv(key, value)
    return f"gs://{name}/runs/a"


def test_urls_name_buckets_by_gcs_rules():
    loc = storage.location("gs://my-bucket.v2/runs//a/")
    assert isinstance(loc, GCSPath) and (loc.bucket, loc.key) == ("my-bucket.v2", "runs/a")
    assert str(loc / "1") == "gs://my-bucket.v2/runs/a/1"
    assert loc.kvstore_spec() == {"driver": "gcs", "bucket": "my-bucket.v2", "path": "runs/a/"}
    assert storage.commit_mode(loc, None) == "commit_file"
    for bad in ("gs://ab/x", "gs://Upper/x", "gs://-dash/x", "gs://a" + "b" * 63 + "/x"):
        with pytest.raises(StorageURLError, match="not a GCS bucket name"):
            storage.location(bad)
    with pytest.raises(StorageURLError):
        storage.location("gs:bucket/x")  # a typo, never a local directory "gs:bucket"


def test_credentials_are_found_where_tensorstore_looks(tmp_path):
    assert gcs_settings({"GOOGLE_AUTH_TOKEN_FOR_TESTING": "t"})["credential_source"] == (
        "GOOGLE_AUTH_TOKEN_FOR_TESTING"
    )
    keyfile = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")}
    assert gcs_settings(keyfile)["credential_source"] == "GOOGLE_APPLICATION_CREDENTIALS"
    # gcloud's application default credentials, in the config folder gcloud uses.
    folder = {"CLOUDSDK_CONFIG": str(tmp_path), "HOME": str(tmp_path)}
    assert gcs_settings(folder)["credential_source"] is None
    (tmp_path / "application_default_credentials.json").write_text("{}")
    assert gcs_settings(folder)["credential_source"] == str(
        tmp_path / "application_default_credentials.json"
    )
    url = {"TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:1/"}
    assert gcs_settings(url)["endpoint"] == "http://127.0.0.1:1"
    assert gcs_settings({})["endpoint"] is None


def test_refusals_are_worded_by_what_the_user_can_fix(monkeypatch, tmp_path):
    """The texts tensorstore gives for 401, 403, 404 and 429 (fake-gcs-server sends none
    of them but 404: see the module's docstring)."""
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.delenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    anonymous = GCSPath("my-bucket", "x")
    denied = ValueError("PERMISSION_DENIED: Forbidden [http_response_code='403']")
    assert anonymous.failed_request(denied)
    why = anonymous.classify(denied)
    assert why == "no Google credentials were found in this process's environment"
    assert "gcloud auth application-default login" in anonymous.advice(why)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    keyed = GCSPath("my-bucket", "x")
    for text in (
        "UNAUTHENTICATED: Unauthorized [http_response_code='401']",
        "PERMISSION_DENIED: Forbidden [http_response_code='403']",
    ):
        assert keyed.classify(ValueError(text)) == "the store refused the credentials"
    throttled = ValueError("RESOURCE_EXHAUSTED: All 6 retry attempts failed [code='429']")
    assert "throttling" in keyed.classify(throttled)
    assert keyed.classify(ValueError("NOT_FOUND: Not Found [http_response_code='404']")) == (
        "bucket 'my-bucket' does not exist"
    )


def test_unreachable_endpoint_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "testing")
    t0 = time.monotonic()
    with pytest.raises(PeerFailedError) as info:
        AsyncCheckpointer("gs://some-bucket/x").save(1, {"w": np.ones(4, np.float32)})
    assert time.monotonic() - t0 < 60
    msg = str(info.value)
    assert "did not answer" in msg and "TENSORSTORE_GCS_HTTP_URL" in msg, msg
    assert "\n" not in msg


def test_a_missing_bucket_reads_as_empty_and_the_error_says_so(gcs, root):
    missing = f"gs://no-such-bucket-{uuid.uuid4().hex[:6]}/x"
    with pytest.raises(StepNotFoundError) as info:
        AsyncCheckpointer(missing).restore()
    assert "a bucket that does not exist also reads as empty on gs://" in str(info.value)
    # An empty root in a bucket that exists gets the same hint (GCS answers both
    # alike); a root with steps never does.
    ck = AsyncCheckpointer(root)
    ck.save(1, {"w": np.arange(4, dtype=np.float32)})
    ck.wait_until_finished()
    with pytest.raises(StepNotFoundError) as info:
        ck.restore(7)
    assert "complete steps there: 1" in str(info.value)
    assert "does not exist" not in str(info.value)


async def test_server_routes_list_a_bucket_root_with_the_servers_credentials(
    jp_fetch, root, monkeypatch
):
    ck = AsyncCheckpointer(root)
    ck.save(1, {"w": np.arange(8, dtype=np.float32)})
    ck.wait_until_finished()
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": root})
    assert code == 200, data
    [entry] = data["entries"]
    assert (entry["step"], entry["state"]) == (1, "complete")
    code, data = await api_get(jp_fetch, "operations", params={"root": root})
    assert code == 200 and [o["status"] for o in data["operations"]] == ["committed"]
    # Without credentials in the server's environment, buckets are not read at all.
    monkeypatch.delenv("GOOGLE_AUTH_TOKEN_FOR_TESTING")
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    code, data = await api_get(jp_fetch, "checkpoints", params={"root": root})
    assert code == 403 and "GOOGLE_APPLICATION_CREDENTIALS" in data["message"], data
    # ... and where it would send them, and how to point it at a server like this one.
    assert "TENSORSTORE_GCS_HTTP_URL" in data["message"], data
    assert "this server would ask http://127.0.0.1:" in data["message"], data
