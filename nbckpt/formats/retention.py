"""Which steps a root keeps: the retention policy, as Orbax users know it.

A :class:`RetentionPolicy` says which complete steps survive a save: the newest
``max_to_keep``, every ``keep_period``-th step for good, and the ``best_n`` best by a
metric recorded with each save. :meth:`RetentionPolicy.doomed` is the pure decision
(tested on its own); :func:`nbckpt.engine.save.prune.apply_retention` carries it out on
the primary after each commit, removing only steps nbckpt created, each one crash-safely.
``save_interval_steps`` drives :func:`should_save`. This module needs no jax, so the
notebook side checks a policy before anything is sent to the engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from nbckpt.protocol import check_name

__all__ = ["BestMode", "RetentionPolicy", "StepRecord", "check_metrics", "should_save"]

#: Whether a smaller (``"min"``, a loss) or a larger (``"max"``, an accuracy) metric wins.
BestMode = Literal["min", "max"]


@dataclass(frozen=True)
class StepRecord:
    """What retention knows of one complete step nbckpt created."""

    step: int
    metrics: Mapping[str, float]


def _count(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1 or None, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """Which complete steps a root keeps after each save.

    A step survives if any rule keeps it: it is among the newest ``max_to_keep``; its
    number is a multiple of ``keep_period`` (kept for good); it is among the
    ``best_n`` best by ``best_metric``; it was saved without that metric while
    ``best_n`` is set (it cannot be ranked, so it is not thrown away: Orbax's
    default too); or it is the newest step. With neither ``max_to_keep`` nor
    ``best_n`` every step is kept. Only steps nbckpt created are counted or removed:
    Orbax steps and foreign folders in the same root are never touched.

    Attributes
    ----------
    max_to_keep
        Keep the newest this many steps; None sets no such limit.
    keep_period
        Also keep every step whose number is a multiple of this, for good.
    best_n
        Also keep the best this many steps by ``best_metric``.
    best_metric
        The metric (``--metric loss=0.31`` at save time) that ranks steps; required
        with ``best_n``.
    best_mode
        ``"min"``: smaller is better (a loss); ``"max"``: larger is better.
    save_interval_steps
        :func:`should_save` says yes only to multiples of this (None: every step).
    """

    max_to_keep: int | None = None
    keep_period: int | None = None
    best_n: int | None = None
    best_metric: str | None = None
    best_mode: BestMode = "min"
    save_interval_steps: int | None = None

    def __post_init__(self) -> None:
        _count(self.max_to_keep, "max_to_keep")
        _count(self.keep_period, "keep_period")
        _count(self.best_n, "best_n")
        _count(self.save_interval_steps, "save_interval_steps")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        if (self.best_n is None) != (self.best_metric is None):
            raise ValueError(
                "best_n and best_metric go together: keep the best N steps by which metric? "
                "(for example best_n=3, best_metric='loss')"
            )
        if self.best_metric is not None:
            check_metrics({self.best_metric: 0.0})

    @property
    def limits(self) -> bool:
        """Whether this policy ever removes a step."""
        return self.max_to_keep is not None or self.best_n is not None

    def as_dict(self) -> dict[str, Any]:
        """Return the policy as a JSON-able dict (its fields)."""
        return asdict(self)

    def describe(self) -> str:
        """Say the policy in one line, as ``%ckpt_retention`` prints it."""
        parts = []
        if self.max_to_keep is not None:
            parts.append(f"the newest {self.max_to_keep}")
        if self.keep_period is not None:
            parts.append(f"every multiple of {self.keep_period} for good")
        if self.best_n is not None:
            better = "lowest" if self.best_mode == "min" else "highest"
            parts.append(f"the {self.best_n} with the {better} {self.best_metric}")
        kept = "keep every step" if not self.limits else "keep " + ", ".join(parts)
        if self.limits:
            kept += ", and the latest"
        if self.save_interval_steps is not None:
            kept += f"; save every {self.save_interval_steps} steps"
        return kept

    def doomed(self, records: Iterable[StepRecord]) -> list[int]:
        """Return the steps this policy removes from ``records``, ascending."""
        recs = sorted(records, key=lambda r: r.step)
        if not self.limits or not recs:
            return []
        keep = {recs[-1].step}
        if self.max_to_keep is not None:
            keep.update(r.step for r in recs[-self.max_to_keep :])
        if self.keep_period is not None:
            keep.update(r.step for r in recs if r.step % self.keep_period == 0)
        if self.best_n is not None and self.best_metric is not None:
            ranked = [r for r in recs if _finite(r.metrics.get(self.best_metric))]
            keep.update(r.step for r in recs if r not in ranked)
            sign = 1.0 if self.best_mode == "min" else -1.0
            # Ties go to the newer step, which holds the more recent state.
            ranked.sort(key=lambda r: (sign * float(r.metrics[self.best_metric or ""]), -r.step))
            keep.update(r.step for r in ranked[: self.best_n])
        return [r.step for r in recs if r.step not in keep]


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _as_number(value: object) -> float | None:
    """``value`` as a float if it is a real number, else None.

    Python ints and floats, NumPy scalars (``np.float32(0.3)``, ``np.int64(2)``) and
    0-d arrays (a jax loss, ``jnp.mean(...)``) are numbers; booleans are not. This
    module does not import numpy or jax: a 0-d array is told by its shape and dtype.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    dtype = getattr(value, "dtype", None)
    if getattr(value, "shape", None) == () and getattr(dtype, "kind", "") in ("i", "u", "f"):
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    return None


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Return ``metrics`` as ``{name: float}``, or raise ValueError naming the bad entry.

    Names are 1 to 64 ASCII letters, digits, ``_``, ``.`` or ``-``; values are finite
    real numbers (a NaN loss cannot rank a step): Python ints and floats, NumPy
    scalars, or 0-d NumPy or jax arrays (converted to float).
    """
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        check_name(name, "metric name")
        number = _as_number(value)
        if number is None or not math.isfinite(number):
            raise ValueError(f"metric {name!r} must be a finite number, got {value!r}")
        out[name] = number
    return out


def should_save(step: int, saved: Iterable[int], policy: RetentionPolicy) -> bool:
    """Tell whether ``step`` is due for a save, as Orbax's ``should_save`` does.

    No if it is not newer than the newest step saved already (``saved``); otherwise
    yes when ``save_interval_steps`` is None or divides ``step``.
    """
    steps = list(saved)
    if steps and step <= max(steps):
        return False
    interval = policy.save_interval_steps
    return interval is None or step % interval == 0
