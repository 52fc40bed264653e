"""The reads relay is owned by whoever reads: a ``Reader``, local or through a relay."""

from __future__ import annotations

from typing import Any

from nbckpt.session import reads


class _FakeRelay(reads.Relay):
    def __init__(self) -> None:
        super().__init__(["h0:1"], b"k")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call(self, ref: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((ref, args))
        return ["remote"]


def test_local_reader_runs_here(tmp_path: Any) -> None:
    assert not reads.LOCAL.remote
    assert reads.LOCAL.run(reads.LIST_OPERATIONS, str(tmp_path)) == []


def test_relay_reader_sends_and_leaves_the_module_route_alone(tmp_path: Any) -> None:
    relay = _FakeRelay()
    reader = reads.Reader(relay)
    assert reader.remote and reader.relay is relay
    assert reader.run(reads.LIST_OPERATIONS, str(tmp_path)) == ["remote"]
    assert relay.calls == [(reads.LIST_OPERATIONS, (str(tmp_path),))]
    # A reader is not a global: there is no module-level route to reroute other reads.
    assert not any(hasattr(reads, name) for name in ("use", "release", "remote", "run"))
