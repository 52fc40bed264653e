"""What a root keeps and where its steps go: the client's retention, tiers and rollback.

:class:`~nbckpt.session.client.CheckpointClient` has these from :class:`RootPolicies`;
each sets or reads a policy of one root on every engine (``%ckpt_retention``,
``%ckpt_tiers``, ``%ckpt_rollback``). Nothing here imports jax.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from nbckpt.formats.retention import RetentionPolicy
from nbckpt.session.rpc import AGENT, call_key
from nbckpt.session.tiers import TiersView, apply_tiers, tier_fields

if TYPE_CHECKING:
    from nbckpt.session.cluster import JaxCluster
    from nbckpt.session.reads import Reader

__all__ = ["RootPolicies"]


class RootPolicies:
    """The policies of a root, on every engine of :attr:`cluster`."""

    cluster: JaxCluster

    @property
    def reader(self) -> Reader:
        """Where reads of checkpoint records run (the client's)."""
        raise NotImplementedError

    def root(self, directory: str | os.PathLike[str] | None = None) -> str:
        """The root ``directory`` means, or the default one (the client's)."""
        raise NotImplementedError

    def retention(
        self,
        policy: RetentionPolicy | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> dict[str, Any]:
        """Set the retention policy of a root on every engine (None: only read it).

        The primary applies it after each commit from then on, removing only steps
        nbckpt created. Returns ``{"policy": ..., "text": ..., "root": ...}`` as
        process 0 holds it.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        fields = None if policy is None else policy.as_dict()
        results = self.cluster.apply(
            f"{AGENT}:set_retention", root, fields, what="retention policy", timeout_s=60
        )
        return dict(results[0])

    def tiers(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        local: str | os.PathLike[str] | None = None,
        replicas: int | None = None,
        persistent_every: int | None = None,
        keep: int | None = None,
        off: bool = False,
    ) -> TiersView:
        """Set a root's local tier on every engine (or turn it ``off``); return its view.

        ``local`` is each host's directory, absolute (``{process}`` in it becomes each
        process's index); ``replicas``, ``persistent_every`` and ``keep`` (default 1, 1,
        2) are ``AsyncCheckpointer.set_tiers``'s ``local_*`` options. With neither
        ``local`` nor ``off``, only reports which host holds which step.

        Raises
        ------
        ValueError
            If the options are wrong or go without ``local`` (nothing is sent).
        """
        fields = tier_fields(local, replicas, persistent_every, keep, off)
        return apply_tiers(self.cluster, self.reader, self.root(directory), fields)

    def should_save(self, step: int, *, directory: str | os.PathLike[str] | None = None) -> bool:
        """Tell whether ``step`` is due for a save under the root's retention policy.

        False if the root already holds a complete step at or after ``step``; otherwise
        True when the policy's ``save_interval_steps`` is unset or divides ``step``.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        answers = self.cluster.apply(
            f"{AGENT}:should_save", root, step, what="should_save", timeout_s=60
        )
        return bool(answers[0])

    def rollback(self, step: int, *, directory: str | os.PathLike[str] | None = None) -> list[int]:
        """Delete the root's complete steps newer than ``step``, so training goes on from it.

        A save of a step older than the newest one is refused (retention would delete
        it, and a restore would pick the newer step); this is the way back. Only steps
        nbckpt created are removed, each crash-safely. Returns the removed steps.
        """
        self.cluster.check_alive()
        root = self.root(directory)
        removed = self.cluster.apply(
            f"{AGENT}:rollback", root, step, what="rollback", timeout_s=120, key=call_key()
        )
        return [int(s) for s in removed[0]]
