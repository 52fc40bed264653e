"""The jupyter-server extension: authenticated routes over checkpoint roots.

Routes (under the server's base URL), every one ``@tornado.web.authenticated``:

- ``GET nbckpt/api/checkpoints?root=R``
- ``GET nbckpt/api/operations?root=R``
- ``GET nbckpt/api/operations/<op>?root=R``
- ``GET nbckpt/api/protocol``: the protocol's names (:func:`nbckpt.protocol.as_json`)
- ``GET nbckpt/api/roots``: the roots running clusters use, and roots found below the
  server's root directory (:mod:`nbckpt.server.roots`)
- ``GET nbckpt/api/activity``: saves in flight and failures in running clusters' roots

``R`` is relative to the server's root directory, or an absolute path under it, and
may not leave it. Every answer is a view model computed in Python
(:mod:`nbckpt.views.answers`, shapes in :mod:`nbckpt.protocol.views`); the lab
extension draws it as it comes, typed by ``labextension/generated/nbckpt.d.ts``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "_load_jupyter_server_extension",
]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Tell JupyterLab where the prebuilt lab extension is (the shared-data copy)."""
    return [{"src": "labextension", "dest": "nbckpt"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Name the module that loads the server extension."""
    return [{"module": "nbckpt"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Register the routes on a running ``ServerApp``."""
    from nbckpt.server.handlers import setup_handlers

    setup_handlers(server_app.web_app, server_app.root_dir)
    server_app.log.info("nbckpt: checkpoint routes registered under nbckpt/api/")
