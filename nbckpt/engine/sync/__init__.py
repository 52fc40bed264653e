"""Signalling between the JAX processes: barriers, agreement, liveness, the join."""
