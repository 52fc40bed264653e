"""The engine: runs inside every JAX process.

Public names::

    from nbckpt.engine import AsyncCheckpointer, latest_step, all_steps
    from nbckpt.engine import TrainingCheckpointer, SavePolicy   # for training loops

It never imports IPython, widgets or ipyparallel.
"""

from nbckpt.engine.checkpointer import AsyncCheckpointer, CheckpointerOptions
from nbckpt.engine.sync.barriers import (
    CoordinationServiceClient,
    InProcessClient,
    SignalingClient,
    Synchronizer,
    default_client,
)
from nbckpt.engine.training import SavePolicy, TrainingCheckpointer
from nbckpt.formats.layout import all_steps, latest_step

__all__ = [
    "AsyncCheckpointer",
    "CheckpointerOptions",
    "CoordinationServiceClient",
    "InProcessClient",
    "SavePolicy",
    "SignalingClient",
    "Synchronizer",
    "TrainingCheckpointer",
    "all_steps",
    "default_client",
    "latest_step",
]
