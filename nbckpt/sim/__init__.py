"""The control plane of a large job, simulated on one machine.

:class:`Simulation` runs many simulated JAX processes, each with a real client of one
real coordination service, through nbckpt's own heartbeats, barriers, preflight
agreement, save job, journal and commit; only the devices and the array bytes are
missing (see :mod:`nbckpt.sim.worker`). ``benchmarks/scale.py`` measures it at up to a
thousand processes.
"""

from nbckpt.sim.cluster import BarrierTiming, SaveOutcome, Simulation

__all__ = ["BarrierTiming", "SaveOutcome", "Simulation"]
