"""The handles live in ``nbckpt.session.handles``; the client's module re-exports them."""

from __future__ import annotations

from nbckpt.session import client, handles, reads


def test_handles_keep_their_client_import_path() -> None:
    assert client.SaveHandle is handles.SaveHandle
    assert client.BarrierReport is handles.BarrierReport


def test_a_handle_without_a_client_reads_here() -> None:
    handle = handles.SaveHandle(op="x", step=1, root="/nowhere", blocked_s=[], client=None)  # type: ignore[arg-type]
    assert handle.reader is reads.LOCAL
