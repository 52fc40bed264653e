"""A real S3-compatible store for tests, and a proxy that injects faults in front of it.

:class:`S3Server` runs moto's standalone server (``python -m moto.server``) in a
subprocess bound to 127.0.0.1 only, so nbckpt's ``s3://`` roots are tested through
tensorstore's ``s3`` driver over a real socket. :class:`FaultProxy` sits between the
client and the server and can throttle (HTTP 503 ``SlowDown``) or drop connections.

Both hand out the environment that points nbckpt at them (``env()``); nbckpt reads it
when an :class:`~nbckpt.storage.S3Path` is made::

    with S3Server() as server, FaultProxy(server.endpoint) as proxy:
        server.create_bucket("ck")
        monkeypatch.setattr(os, "environ", {**os.environ, **proxy.env()})
        proxy.throttle(3)
        S3Path("ck", "x").write_bytes(b"1")  # retried past the three 503s
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from nbckpt.storage.local_s3 import _CREDENTIALS, HOST, S3Server, closed_port

__all__ = ["SLOWDOWN_BODY", "FaultProxy", "S3Server", "closed_port"]


#: The body of a throttled answer, as S3 sends it.
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"</Error>"
)

# Headers that describe one hop of a connection, never forwarded (RFC 9110 7.6.1), plus
# the framing headers the proxy recomputes and the Expect it answers itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
    }
)


class _ProxyHandler(BaseHTTPRequestHandler):
    """One client connection of a :class:`FaultProxy`; forwards each request upstream."""

    protocol_version = "HTTP/1.1"
    server: _ProxyHTTPServer
    # The upstream connection of this client connection (kept alive across requests).
    _upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        self._upstream = None

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self._upstream is not None:
            self._upstream.close()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read the counters, not a log."""

    # -- the request -----------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            line = self.rfile.readline(65537)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers: dropped
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline(3)  # the CRLF after the chunk

    def _drop(self) -> None:
        """Close the connection without answering."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD" and status not in (204, 304) and status >= 200:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.wfile.flush()

    def _handle(self) -> None:
        proxy = self.server.proxy
        framing = (
            "chunked"
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            else "length"
            if "Content-Length" in self.headers
            else "none"
        )
        try:
            body = self._read_body()
        except ValueError as e:  # a malformed chunk size or Content-Length
            self.close_connection = True
            self._answer(400, [("Content-Type", "text/plain")], f"bad request body: {e}".encode())
            return
        if not proxy._admit(self.command, self.path, framing):
            self._drop()
            return
        if proxy._should_throttle():
            self._answer(
                503,
                [("Content-Type", "application/xml"), ("Retry-After", "0")],
                SLOWDOWN_BODY,
            )
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        try:
            response = self._forward(headers, body)
        except OSError as e:
            message = f"proxy could not reach {proxy.upstream}: {e}".encode()
            self._answer(502, [("Content-Type", "text/plain")], message)
            return
        data = response.read()
        out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        if self.command == "HEAD" or response.status == 304:
            # No body: relay the length the upstream announced (the object's size).
            length = response.getheader("Content-Length")
            if length is not None:
                out.append(("Content-Length", length))
        self._answer(response.status, out, data)

    def _forward(self, headers: dict[str, str], body: bytes) -> http.client.HTTPResponse:
        proxy = self.server.proxy
        for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    proxy._host, proxy._port, timeout=proxy.upstream_timeout
                )
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                return self._upstream.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise
            except OSError:
                self._upstream.close()
                self._upstream = None
                raise
        raise AssertionError("unreachable")

    # The methods BaseHTTPRequestHandler dispatches to (its names, not ours).
    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _handle  # noqa: N815


class _ProxyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # While down, a new connection is closed before a byte is read or answered.
        if self.proxy._refuse_connection():
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)
            return False
        return True


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of a store, that can inject faults.

    Every request (any method, with its headers and body, sent with ``Content-Length``
    or chunked) is forwarded to ``upstream`` and the answer relayed back; connections
    are kept alive on both sides. Faults, settable at any time from any thread:

    - :meth:`throttle`/:meth:`throttle_forever`: answer ``503 SlowDown`` as S3 does;
    - :meth:`down`: close every connection without answering (an unreachable store).

    Parameters
    ----------
    upstream
        The store's address, ``http://host:port``.
    upstream_timeout
        Seconds to wait on the store for one answer.

    Attributes
    ----------
    requests
        Requests received (throttled ones included; dropped ones too, once read).
    throttled
        Requests answered with ``503 SlowDown``.
    dropped
        Requests and connections closed unanswered while down.
    connections
        Client connections accepted (fewer than ``requests``: connections are reused).
    seen
        ``(method, path, framing)`` of the latest 1000 requests, framing being how the
        body came: ``"chunked"``, ``"length"`` (Content-Length) or ``"none"``.
    """

    def __init__(self, upstream: str, upstream_timeout: float = 30.0) -> None:
        scheme, _, hostport = upstream.partition("://")
        if scheme != "http" or not hostport:
            raise ValueError(f"FaultProxy forwards to http://host:port, not {upstream!r}")
        host, _, port = hostport.rstrip("/").rpartition(":")
        self.upstream = upstream.rstrip("/")
        self.upstream_timeout = upstream_timeout
        self._host, self._port = host, int(port)
        self._lock = threading.Lock()
        self._throttle_next = 0
        self._throttle_forever = False
        self._down = False
        self.requests = 0
        self.throttled = 0
        self.dropped = 0
        self.connections = 0
        #: ``(method, path, framing)`` of the latest requests; framing is ``"chunked"``,
        #: ``"length"`` (Content-Length) or ``"none"`` (no body).
        self.seen: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=1000)
        self._server = _ProxyHTTPServer((HOST, 0), _ProxyHandler)
        self._server.proxy = self
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FaultProxy:{self.port}",
            daemon=True,
        )
        self._thread.start()
        atexit.register(self.close)

    # -- faults ----------------------------------------------------------------------

    def throttle(self, n: int) -> None:
        """Answer the next ``n`` requests with ``503 SlowDown``."""
        with self._lock:
            self._throttle_next = n

    def throttle_forever(self, on: bool) -> None:
        """Answer every request with ``503 SlowDown`` while ``on``."""
        with self._lock:
            self._throttle_forever = on

    def down(self, on: bool) -> None:
        """While ``on``, close each connection (new or kept alive) without answering."""
        with self._lock:
            self._down = on

    @property
    def is_down(self) -> bool:
        """Whether the proxy is dropping connections."""
        with self._lock:
            return self._down

    def _refuse_connection(self) -> bool:
        """Whether to close a new connection unanswered (counted as dropped)."""
        with self._lock:
            if self._down:
                self.dropped += 1
            else:
                self.connections += 1
            return self._down

    def reset(self) -> None:
        """Clear every fault, counter and :attr:`seen`."""
        with self._lock:
            self._throttle_next = 0
            self._throttle_forever = self._down = False
            self.requests = self.throttled = self.dropped = self.connections = 0
            self.seen.clear()

    def _admit(self, method: str, path: str, framing: str) -> bool:
        """Count a request; whether to serve it (False: drop it, the proxy is down)."""
        with self._lock:
            self.requests += 1
            self.seen.append((method, path, framing))
            if self._down:
                self.dropped += 1
                return False
            return True

    def _should_throttle(self) -> bool:
        with self._lock:
            if self._throttle_forever or self._throttle_next > 0:
                self._throttle_next = max(0, self._throttle_next - 1)
                self.throttled += 1
                return True
            return False

    # -- use -------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The proxy's address, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment that points nbckpt's ``s3://`` roots at this proxy."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **_CREDENTIALS}

    def close(self) -> None:
        """Stop listening and serving."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
