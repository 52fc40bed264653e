"""``%ckpt_tiers``: show or set a root's local tier, where saves go first.

:class:`~nbckpt.magics.commands.NbckptMagics` inherits :class:`TierMagics` and
registers its magics (:data:`TIER_MAGICS`) by name, as it does the inspection ones.
"""

from __future__ import annotations

from nbckpt.magics import args as a
from nbckpt.magics.base import MagicsBase, usage_errors
from nbckpt.session.tiers import tiers_text

__all__ = ["TIER_MAGICS", "TierMagics"]

#: The magics defined here, registered by the class that IPython loads.
TIER_MAGICS = ("ckpt_tiers",)


class TierMagics(MagicsBase):
    """The magic of the local tier: each host's copies of the newest steps."""

    @a.TIERS
    def ckpt_tiers(self, line: str) -> None:
        """Show or set ROOT's local tier: each host's own copies of the newest steps.

        With ``--local DIR`` every save to ROOT first goes to each host's DIR (host
        memory such as ``/dev/shm/ckpt``, or a local disk) and to ``--replicas`` other
        hosts; only the steps divisible by ``--persistent-every`` (and a ``%ckpt_save
        --persistent``) also go to ROOT. A restore then reads the newest step the live
        hosts hold whole, or ROOT's newest if that is newer. A host is what shares a
        local directory. ``--off`` turns the tier off. It then shows, as it does without
        options, per step which host holds which processes' shards, whether the live hosts
        hold it whole (recoverable), whether ROOT has it, and what a restore would read.
        """
        args = a.parse_tiers_args(line)
        client = self._client()
        with usage_errors():
            view = client.tiers(
                args.directory,
                local=args.local,
                replicas=args.replicas,
                persistent_every=args.persistent_every,
                keep=args.keep,
                off=args.off,
            )
        print(tiers_text(view))
