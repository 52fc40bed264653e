"""nbckpt.storage: local and ``s3://`` locations, against a real S3 server on 127.0.0.1.

The S3 tests talk to moto's standalone server (:class:`tests.s3server.S3Server`) through
tensorstore's ``s3`` driver over a real socket; the failure tests put a
:class:`tests.s3server.FaultProxy` in between, or point at a closed port.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nbckpt import storage
from nbckpt.errors import StorageError, StorageURLError
from nbckpt.storage import S3Path
from nbckpt.storage import s3 as s3_module
from tests.s3server import SLOWDOWN_BODY, FaultProxy, S3Server, closed_port

REPO = Path(__file__).resolve().parent.parent

#: The longest a request to a dead or throttling store may take before nbckpt reports it
#: (nbckpt's retries add up to about 13 s).
FAILURE_BOUND_S = 30.0

#: Variables that would send requests elsewhere, or to a credential chain.
_STRAY_AWS = ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def _point_at(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Make S3Paths made from now on reach the store ``env`` names."""
    for name in _STRAY_AWS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _new_bucket_name() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """moto's S3 server, for this module."""
    with S3Server() as s:
        yield s


@pytest.fixture(scope="module")
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of :func:`server`, for this module."""
    with FaultProxy(server.endpoint) as p:
        yield p


@pytest.fixture
def bucket(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket; the environment points at the server directly."""
    _point_at(monkeypatch, server.env())
    name = _new_bucket_name()
    server.create_bucket(name)
    return name


@pytest.fixture
def root(bucket: str) -> S3Path:
    """A prefix in a new bucket."""
    return S3Path(bucket, "ckpt")


@pytest.fixture
def proxied(
    server: S3Server, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> Iterator[S3Path]:
    """A prefix in a new bucket, reached through the proxy (faults cleared after)."""
    name = _new_bucket_name()
    server.create_bucket(name)
    proxy.reset()
    _point_at(monkeypatch, proxy.env())
    yield S3Path(name, "ckpt")
    proxy.reset()


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retry a failed request once, quickly: for tests of a message, not of the bound.

    Only for stores no other test opens (a closed port, a fresh proxy or server):
    an opened store keeps the retries it was opened with.
    """
    monkeypatch.setattr(
        s3_module, "RETRIES", {"max_retries": 1, "initial_delay": "0.01s", "max_delay": "0.01s"}
    )


def _timed_failure(fn: object) -> tuple[StorageError, float]:
    """Run ``fn``; return the StorageError it raised and the seconds it took."""
    assert callable(fn)
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        fn()
    return info.value, time.monotonic() - start


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


# -- location(): what a root string names ----------------------------------------------


def test_location_local_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert storage.location("rel/x") == tmp_path / "rel" / "x"
    assert storage.location(Path("rel")) == tmp_path / "rel"
    assert storage.location(str(tmp_path)) == tmp_path
    assert storage.location("file:///data/ck") == Path("/data/ck")
    assert isinstance(storage.location("file:///data/ck"), Path)
    assert not storage.is_url("rel/x")
    assert storage.is_url("s3://b/k")


def test_location_s3_urls() -> None:
    loc = storage.location("s3://bkt/run1/")
    assert isinstance(loc, S3Path)
    assert (loc.bucket, loc.key) == ("bkt", "run1")
    assert storage.location("S3://bkt") == S3Path("bkt")
    assert storage.location("s3://bkt//a///b/") == S3Path("bkt", "a/b")
    assert storage.location(loc) is loc


@pytest.mark.parametrize(
    "url",
    [
        "az://bkt/k",
        "http://example.invalid/x",
        "s3://",
        "s3:///k",
        "s3://bkt/../x",
        "gs://",
        "gs://Bkt/k",
        "file://rel",
    ],
)
def test_location_refuses_other_urls(url: str) -> None:
    with pytest.raises(StorageURLError, match=re.escape(url)) as info:
        storage.location(url)
    assert "nbckpt supports" in _one_line(info.value)
    assert isinstance(info.value, ValueError)


def test_s3_path_is_never_a_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    loc = storage.location("s3://bkt/run1/x")
    assert not hasattr(loc, "__fspath__")
    assert not isinstance(loc, os.PathLike)
    with pytest.raises(TypeError):
        open(loc, "wb")  # type: ignore[call-overload]  # noqa: SIM115
    with pytest.raises(TypeError):
        os.fspath(loc)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        Path(loc)  # type: ignore[arg-type]
    with pytest.raises(StorageURLError):
        storage.location("az://bkt/run1")
    assert not isinstance(storage.location("gs://bkt/run1"), os.PathLike)
    assert not (tmp_path / "s3:").exists()
    assert not (tmp_path / "gs:").exists()
    assert not (tmp_path / "az:").exists()
    assert list(tmp_path.iterdir()) == []


# -- pure path operations -----------------------------------------------------------------


def test_pure_path_operations() -> None:
    p = S3Path("bkt", "/run//step_1/x.json/")
    assert p.key == "run/step_1/x.json"
    assert str(p) == "s3://bkt/run/step_1/x.json"
    assert repr(p) == "S3Path('s3://bkt/run/step_1/x.json')"
    assert str(S3Path("bkt")) == "s3://bkt"
    assert (p.name, p.stem) == ("x.json", "x")
    assert p.parent == S3Path("bkt", "run/step_1")
    assert p.parent.parent.parent == S3Path("bkt")
    assert S3Path("bkt").parent == S3Path("bkt")
    assert S3Path("bkt").name == ""
    assert p.with_name("y.bin") == S3Path("bkt", "run/step_1/y.bin")
    with pytest.raises(ValueError):
        S3Path("bkt").with_name("x")
    child = S3Path("bkt", "run") / "a" / "b/c/"
    assert type(child) is S3Path
    assert child.key == "run/a/b/c"
    assert child.settings == S3Path("bkt").settings
    assert (S3Path("bkt") / "x").key == "x"
    for bad in ("..", "a/../b", "."):
        with pytest.raises(ValueError):
            S3Path("bkt", "run") / bad
    assert p.relative_to(S3Path("bkt", "run")) == "step_1/x.json"
    assert p.relative_to(S3Path("bkt")) == "run/step_1/x.json"
    assert p.relative_to(p) == ""
    for other in (S3Path("bkt", "ru"), S3Path("other", "run"), S3Path("bkt", "run/step_1/x")):
        with pytest.raises(ValueError):
            p.relative_to(other)
    assert p.absolute() is p
    assert not p.is_symlink()


def test_equality_and_hash() -> None:
    a, b = S3Path("bkt", "a/b"), S3Path("bkt", "/a//b/")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, S3Path("bkt", "a")}) == 2
    assert a != S3Path("other", "a/b")
    assert a != "s3://bkt/a/b"
    assert sorted([S3Path("bkt", "b"), S3Path("bkt", "a")]) == [
        S3Path("bkt", "a"),
        S3Path("bkt", "b"),
    ]


def test_can_rename_and_kvstore_spec_local(tmp_path: Path) -> None:
    assert storage.can_rename(tmp_path)
    assert not storage.can_rename(S3Path("bkt", "x"))
    assert storage.kvstore_spec(tmp_path) == {"driver": "file", "path": f"{tmp_path}/"}


def test_local_write_durable_and_remove_tree(tmp_path: Path) -> None:
    storage.write_durable(tmp_path / "a.txt", "héllo")
    assert (tmp_path / "a.txt").read_text("utf-8") == "héllo"
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_bytes(b"1")
    storage.sync_dir(tmp_path)
    storage.remove_tree(tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# -- on the server -------------------------------------------------------------------------


def test_write_all_durable_batches_local_and_object_writes(tmp_path: Path, root: S3Path) -> None:
    """One batch writes local files and objects; a path it cannot fsync fails it."""
    (tmp_path / "d").mkdir()
    earlier = tmp_path / "d" / "earlier"
    earlier.write_bytes(b"0")
    storage.write_all_durable(
        {tmp_path / "a": "one", tmp_path / "d" / "b": b"two", root / "c": "three"},
        [tmp_path, tmp_path / "d"],
        synced_too=[earlier],
    )
    assert (tmp_path / "a").read_text() == "one"
    assert (tmp_path / "d" / "b").read_bytes() == b"two"
    assert (root / "c").read_bytes() == b"three"
    with pytest.raises(FileNotFoundError):
        storage.write_all_durable({}, [tmp_path / "gone"])
    with pytest.raises(FileNotFoundError):
        storage.write_all_durable({tmp_path / "missing" / "x": "x"})


def test_settings_come_from_the_environment(root: S3Path, server: S3Server) -> None:
    assert (root.settings["endpoint"], root.settings["region"]) == (server.endpoint, "us-east-1")
    assert root.settings["credentials"] == "environment"
    assert root.endpoint == server.endpoint
    spec = storage.kvstore_spec(root)
    assert spec["driver"] == "s3"
    assert spec["bucket"] == root.bucket
    assert spec["endpoint"] == server.endpoint
    assert spec["path"] == "ckpt/"
    assert storage.kvstore_spec(S3Path(root.bucket))["path"] == ""


def test_write_read_round_trip(root: S3Path) -> None:
    data = bytes(range(256)) * 1000
    assert (root / "a.bin").write_bytes(data) == len(data)
    assert (root / "a.bin").read_bytes() == data
    (root / "t.txt").write_text("héllo")
    assert (root / "t.txt").read_text() == "héllo"
    (root / "a.bin").write_bytes(b"new")
    assert (root / "a.bin").read_bytes() == b"new"
    (root / "empty").write_bytes(b"")
    assert (root / "empty").read_bytes() == b""
    (root / "sub").mkdir(parents=True, exist_ok=True)  # nothing to do


def test_read_missing_key(root: S3Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(str(root / "nope"))):
        (root / "nope").read_bytes()


def test_is_file_is_dir_exists(root: S3Path) -> None:
    (root / "d" / "x").write_bytes(b"1")
    (root / "d" / "xy").write_bytes(b"2")
    (root / "d" / "sub" / "z").write_bytes(b"3")
    obj, prefix, missing = root / "d" / "x", root / "d", root / "nope"
    assert (obj.is_file(), obj.is_dir(), obj.exists()) == (True, False, True)
    assert (prefix.is_file(), prefix.is_dir(), prefix.exists()) == (False, True, True)
    assert (missing.is_file(), missing.is_dir(), missing.exists()) == (False, False, False)
    # A key that only starts another key is neither an object nor a prefix.
    assert not (root / "d" / "s").exists()
    assert not (root / "d" / "su").is_dir()
    (root / "d" / "xy").unlink()
    assert not (root / "d" / "xy").exists()
    assert (root / "d" / "x").is_file()
    (root / "d" / "xy").unlink(missing_ok=True)  # deleting a missing object is not an error
    bucket_root = S3Path(root.bucket)
    assert bucket_root.exists()
    assert bucket_root.is_dir()
    assert not bucket_root.is_file()


def test_iterdir_lists_one_level_and_glob(root: S3Path) -> None:
    for key in ("a.json", "b.json", "c.bin", "d/x", "d/y/z", "e/f"):
        (root / key).write_bytes(b"1")
    (S3Path(root.bucket, "ckpt2") / "not-mine").write_bytes(b"1")
    assert list(root.iterdir()) == [root / n for n in ("a.json", "b.json", "c.bin", "d", "e")]
    assert list((root / "d").iterdir()) == [root / "d" / "x", root / "d" / "y"]
    assert list((root / "nope").iterdir()) == []
    assert [p.name for p in root.glob("*.json")] == ["a.json", "b.json"]
    assert [p.name for p in root.glob("[de]")] == ["d", "e"]
    assert root.list_keys() == ["a.json", "b.json", "c.bin", "d/x", "d/y/z", "e/f"]
    assert [p.name for p in S3Path(root.bucket).iterdir()] == ["ckpt", "ckpt2"]


def test_remove_tree_removes_exactly_the_prefix(root: S3Path) -> None:
    keep = ["10/a", "10", "1.txt", "1-x", "1a/b", "0/a", "2"]
    gone = ["1", "1/a", "1/b/c", "1/10/d"]
    for key in keep + gone:
        (root / key).write_bytes(key.encode())
    storage.remove_tree(root / "1")
    assert root.list_keys() == sorted(keep)
    for key in keep:
        assert (root / key).read_bytes() == key.encode()
    storage.remove_tree(root / "nope")  # nothing there: nothing to do
    assert root.list_keys() == sorted(keep)


def test_remove_tree_refuses_the_bucket(root: S3Path) -> None:
    (root / "x").write_bytes(b"1")
    bucket_root = S3Path(root.bucket)
    with pytest.raises(ValueError, match="refusing to delete every object"):
        storage.remove_tree(bucket_root)
    with pytest.raises(ValueError):
        storage.remove_tree(storage.location(f"s3://{root.bucket}/"))
    assert (root / "x").read_bytes() == b"1"


def test_write_durable_and_sync_dir(root: S3Path) -> None:
    storage.write_durable(root / "commit", '{"step": 1}')
    storage.write_durable(root / "raw", b"\x00\x01")
    storage.sync_dir(root)  # nothing to do on an object store
    assert (root / "commit").read_text() == '{"step": 1}'
    assert (root / "raw").read_bytes() == b"\x00\x01"


def test_kvstore_spec_with_zarr(root: S3Path) -> None:
    import tensorstore as ts

    spec = {
        "driver": "zarr",
        "kvstore": storage.kvstore_spec(root / "step_1" / "w"),
        "metadata": {"chunks": [2, 3]},
    }
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    out = ts.open(spec, create=True, dtype=ts.float32, shape=array.shape).result()
    out.write(array).result()
    back = ts.open(spec, open=True).result().read().result()
    np.testing.assert_array_equal(back, array)
    assert (root / "step_1" / "w").is_dir()
    assert "step_1/w/.zarray" in root.list_keys()
    assert len([k for k in root.list_keys() if k.startswith("step_1/w/")]) == 1 + 4


# -- failures ------------------------------------------------------------------------------


def test_missing_bucket(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    _point_at(monkeypatch, server.env())
    name = _new_bucket_name()  # never created
    loc = S3Path(name, "ckpt/x")
    for action, fn in (("write", lambda: loc.write_bytes(b"1")), ("list", loc.exists)):
        err, took = _timed_failure(fn)
        text = _one_line(err)
        print(f"missing bucket, {action}: {took:.2f} s: {text}")
        assert text.startswith(f"{action} of s3://{name}/ckpt/")
        assert f"bucket '{name}' does not exist" in text
        assert "create the bucket or fix the URL" in text
        assert err.url == str(loc)
        assert took < FAILURE_BOUND_S


def test_missing_bucket_read(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    _point_at(monkeypatch, server.env())
    name = _new_bucket_name()
    with pytest.raises(StorageError, match="does not exist"):
        S3Path(name, "ckpt/x").read_bytes()


def test_unreachable_endpoint_fails_in_bounded_time(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    loc = S3Path(bucket, "ckpt/x")
    err, took = _timed_failure(lambda: loc.write_bytes(b"1"))
    text = _one_line(err)
    print(f"unreachable endpoint (real retries): {took:.2f} s: {text}")
    assert text == (
        f"write of s3://{bucket}/ckpt/x failed: the store at {endpoint} did not answer; "
        "check AWS_ENDPOINT_URL and that the store is up"
    )
    assert took < FAILURE_BOUND_S


@pytest.mark.parametrize("how", ["refused", "dropped"])
def test_unreachable_endpoint_advice(
    how: str,
    server: S3Server,
    bucket: str,
    fast_retries: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FaultProxy(server.endpoint) as down:
        down.down(True)
        endpoint = down.endpoint if how == "dropped" else f"http://127.0.0.1:{closed_port()}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        err, took = _timed_failure(lambda: S3Path(bucket, "ckpt/x").write_bytes(b"1"))
    text = _one_line(err)
    print(f"unreachable endpoint ({how}, fast retries): {took:.2f} s: {text}")
    assert f"the store at {endpoint} did not answer" in text
    assert "check AWS_ENDPOINT_URL and that the store is up" in text


def test_throttled_requests_are_retried(proxied: S3Path, proxy: FaultProxy) -> None:
    proxy.throttle(3)
    start = time.monotonic()
    (proxied / "x").write_bytes(b"payload")
    took = time.monotonic() - start
    print(f"3 x 503 SlowDown, then success: {took:.2f} s")
    assert proxy.throttled == 3
    assert proxy.requests == 4
    # tensorstore sends object bodies with Content-Length (not chunked), and reuses
    # its connections.
    assert [(m, framing) for m, _, framing in proxy.seen] == [("PUT", "length")] * 4
    assert (proxied / "x").read_bytes() == b"payload"
    assert proxy.throttled == 3


def test_throttled_forever_fails_in_bounded_time(proxied: S3Path, proxy: FaultProxy) -> None:
    proxy.throttle_forever(True)
    err, took = _timed_failure(lambda: (proxied / "x").write_bytes(b"payload"))
    text = _one_line(err)
    print(f"throttled forever (real retries): {took:.2f} s: {text}")
    assert text == (
        f"write of {proxied / 'x'} failed: the store kept throttling requests (SlowDown); "
        "save less often or to another prefix, then retry"
    )
    assert err.action == "write"
    # The first attempt and every retry were throttled.
    assert proxy.throttled == proxy.requests == 1 + s3_module.RETRIES["max_retries"]
    assert took < FAILURE_BOUND_S
    proxy.throttle_forever(False)
    (proxied / "x").write_bytes(b"payload")
    assert (proxied / "x").read_bytes() == b"payload"


# -- the test store itself -----------------------------------------------------------------


_FAKE_AUTH = (
    "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0"
)


def _http(
    endpoint: str,
    requests: list[tuple[str, str, bytes | None, dict[str, str]]],
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``requests`` over one kept-alive connection; return each answer.

    Each carries an ``Authorization`` header (moto checks no signature, but answers an
    anonymous request for an object 403).
    """
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    answers = []
    try:
        for method, path, body, extra in requests:
            headers = {"Authorization": _FAKE_AUTH, **extra}
            if body is not None and headers.get("Transfer-Encoding") == "chunked":
                conn.request(
                    method,
                    path,
                    body=iter([body[:5], body[5:]]),
                    headers=headers,
                    encode_chunked=True,
                )
            else:
                conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            answers.append((response.status, dict(response.getheaders()), response.read()))
    finally:
        conn.close()
    return answers


def test_proxy_forwards_with_keep_alive(server: S3Server, proxy: FaultProxy) -> None:
    name = _new_bucket_name()
    proxy.reset()
    key = f"/{name}/k"
    chunked = {"Transfer-Encoding": "chunked"}
    answers = _http(
        proxy.endpoint,
        [
            ("PUT", f"/{name}", None, {}),
            ("PUT", key, b"hello world", chunked),
            ("HEAD", key, None, {}),
            ("GET", key, None, {}),
            ("PUT", key + "2", b"sized", {}),
            ("GET", key + "2", None, {}),
            ("DELETE", key, None, {}),
            ("GET", key, None, {}),
        ],
    )
    statuses = [a[0] for a in answers]
    assert statuses == [200, 200, 200, 200, 200, 200, 204, 404]
    assert answers[2][1]["Content-Length"] == "11"  # HEAD: the object's size, no body
    assert answers[2][2] == b""
    assert answers[3][2] == b"hello world"
    assert answers[5][2] == b"sized"
    assert b"NoSuchKey" in answers[7][2]
    assert [framing for _, _, framing in proxy.seen][1:5] == ["chunked", "none", "none", "length"]
    assert proxy.requests == 8
    assert proxy.connections == 1  # kept alive across all eight
    proxy.throttle(1)
    [(status, headers, body)] = _http(proxy.endpoint, [("GET", key + "2", None, {})])
    assert (status, body) == (503, SLOWDOWN_BODY)
    assert headers["Content-Length"] == str(len(SLOWDOWN_BODY))
    proxy.reset()


def test_proxy_down_drops_connections(server: S3Server) -> None:
    with FaultProxy(server.endpoint) as p:
        p.down(True)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _http(p.endpoint, [("GET", "/moto-api/", None, {})])
        p.down(False)
        assert _http(p.endpoint, [("GET", "/moto-api/", None, {})])[0][0] == 200
        assert p.dropped >= 1


def test_killed_server_fails_requests(monkeypatch: pytest.MonkeyPatch, fast_retries: None) -> None:
    with S3Server() as doomed:
        _point_at(monkeypatch, doomed.env())
        doomed.create_bucket("doomed")
        loc = S3Path("doomed", "x")
        loc.write_bytes(b"1")
        doomed.kill()
        assert not doomed.alive
        err, took = _timed_failure(lambda: loc.write_bytes(b"2"))
        print(f"killed server (fast retries): {took:.2f} s: {_one_line(err)}")
        assert str(loc) in str(err)


def test_server_dies_with_the_test_process() -> None:
    """A server whose test process is SIGKILLed does not outlive it (PR_SET_PDEATHSIG)."""
    code = (
        "import time; from tests.s3server import S3Server; s = S3Server(); "
        "print(s._proc.pid, s.port, flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        pid, port = map(int, child.stdout.readline().split())
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.05)
        assert not _running(pid)
        # A killed process's leader turns zombie before its other threads have dropped
        # the shared file table, so the listening socket can outlive the leader by a
        # moment (a connection then is accepted and reset): wait for the refusal.
        refused = False
        while not refused and time.monotonic() < deadline + 10:
            try:
                _http(f"http://127.0.0.1:{port}", [("GET", "/moto-api/", None, {})])
            except ConnectionRefusedError:
                refused = True
            except (ConnectionResetError, http.client.RemoteDisconnected):
                pass
            if not refused:
                time.sleep(0.05)
        assert refused, f"port {port} still answers after the server process was killed"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# -- what a user types: "", "~", and no credentials at all ---------------------------


def test_an_empty_root_is_refused_in_one_line():
    for text in ("", "  "):
        with pytest.raises(ValueError, match=r"^the checkpoint root is empty") as info:
            storage.location(text)
        assert "\n" not in str(info.value)


def test_a_root_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert storage.location("~/ckpt") == tmp_path / "ckpt"
    assert not (tmp_path / "~").exists()


def test_missing_s3_credentials_are_named_in_one_line(tmp_path, monkeypatch):
    """A store that checks credentials, and none anywhere: say so, not "Unknown"."""
    with S3Server(check_credentials=True) as checking:
        env = checking.env()
        for name in (*_STRAY_AWS, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name, raising=False)
            env.pop(name, None)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws here
        _point_at(monkeypatch, env)
        with pytest.raises(StorageError) as info:
            list(storage.location(f"s3://{_new_bucket_name()}/x").iterdir())
    msg = str(info.value)
    assert "no S3 credentials" in msg and "AWS_ACCESS_KEY_ID" in msg, msg
    assert "Unknown" not in msg and "\n" not in msg
