"""Thin authenticated Tornado handlers over :class:`~nbckpt.server.manager.CheckpointManager`.

The manager's work runs in a thread, off the server's event loop: listing a root reads
a disk, or (an ``s3://`` or ``gs://`` root) makes requests that a slow or unreachable
store may hold for seconds, and the whole Jupyter server must stay responsive meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from nbckpt.errors import StorageError
from nbckpt.server.manager import CheckpointManager, ManagerError, StoreFailedError

__all__ = [
    "ActivityHandler",
    "CheckpointsHandler",
    "OperationHandler",
    "OperationsHandler",
    "ProtocolHandler",
    "RootsHandler",
    "setup_handlers",
]


class _BaseHandler(APIHandler):
    """Map manager errors to a status and a one-line ``{"message": ...}`` body."""

    manager: CheckpointManager

    def initialize(self, manager: CheckpointManager) -> None:
        self.manager = manager

    async def _answer(self, fn: Any, *args: Any) -> None:
        """Answer with ``fn(root, *args)``, ``root`` from the query."""
        await self._run(fn, self.get_query_argument("root", None), *args)

    async def _run(self, fn: Any, *args: Any) -> None:
        try:
            data = await asyncio.to_thread(fn, *args)
        except ManagerError as e:
            self.set_status(e.status)
            data = {"message": str(e)}
        except StorageError as e:  # an object-store root whose store failed
            self.set_status(StoreFailedError.status)
            data = {"message": str(e)}
        self.finish(json.dumps(data))


class CheckpointsHandler(_BaseHandler):
    """``GET /nbckpt/api/checkpoints?root=R``: the entries of a root and their states."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """Answer with :meth:`CheckpointManager.checkpoints`."""
        await self._answer(self.manager.checkpoints)


class OperationsHandler(_BaseHandler):
    """``GET /nbckpt/api/operations?root=R``: the journaled operations of a root."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """Answer with :meth:`CheckpointManager.operations`."""
        await self._answer(self.manager.operations)


class OperationHandler(_BaseHandler):
    """``GET /nbckpt/api/operations/<op>?root=R[&process=P]``: one operation's merged journal.

    Of a job of many processes, the processes that matter, and ``P`` if asked for.
    """

    @tornado.web.authenticated
    async def get(self, op: str) -> None:
        """Answer with :meth:`CheckpointManager.operation`."""
        await self._answer(self.manager.operation, op, self.get_query_argument("process", None))


class RootsHandler(_BaseHandler):
    """``GET /nbckpt/api/roots``: running clusters' roots, and roots found on disk."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """Answer with :meth:`CheckpointManager.roots`."""
        await self._run(self.manager.roots)


class ActivityHandler(_BaseHandler):
    """``GET /nbckpt/api/activity``: what is in flight or failed in running clusters' roots."""

    @tornado.web.authenticated
    async def get(self) -> None:
        """Answer with :meth:`CheckpointManager.activity`."""
        await self._run(self.manager.activity)


class ProtocolHandler(_BaseHandler):
    """``GET /nbckpt/api/protocol``: the protocol's names, for the lab extension."""

    @tornado.web.authenticated
    def get(self) -> None:
        """Answer with :meth:`CheckpointManager.protocol`."""
        self.finish(json.dumps(self.manager.protocol()))


def setup_handlers(web_app: Any, root_dir: str) -> None:
    """Register the routes under ``<base_url>/nbckpt/api/``."""
    base = url_path_join(web_app.settings["base_url"], "nbckpt", "api")
    kwargs = {"manager": CheckpointManager(root_dir)}
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "checkpoints"), CheckpointsHandler, kwargs),
            (url_path_join(base, "operations"), OperationsHandler, kwargs),
            (url_path_join(base, "operations", "([^/]+)"), OperationHandler, kwargs),
            (url_path_join(base, "protocol"), ProtocolHandler, kwargs),
            (url_path_join(base, "roots"), RootsHandler, kwargs),
            (url_path_join(base, "activity"), ActivityHandler, kwargs),
        ],
    )
