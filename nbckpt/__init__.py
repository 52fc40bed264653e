"""nbckpt: asynchronous multihost JAX checkpointing you can run, watch and teach.

The engine (``nbckpt.engine``) runs in every JAX process; importing this top-level
package needs neither jax nor IPython.
"""

from nbckpt.errors import (
    BarrierTimeoutError,
    CheckpointError,
    NbckptError,
    PeerFailedError,
    RootNotWritableError,
    StepExistsError,
    StepNotFoundError,
)
from nbckpt.layout import all_steps, latest_step

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """Register the ``%ckpt_*`` magics: ``%load_ext nbckpt``."""
    from nbckpt.magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "BarrierTimeoutError",
    "CheckpointError",
    "NbckptError",
    "PeerFailedError",
    "RootNotWritableError",
    "StepExistsError",
    "StepNotFoundError",
    "__version__",
    "all_steps",
    "latest_step",
]
