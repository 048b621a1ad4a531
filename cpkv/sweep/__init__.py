"""Sweeps: many runs from configs x grids, into one sweep directory (``cpkv sweep``).

``run_sweep(configs, overrides)`` is the programmatic twin of ``cpkv sweep``;
``resume_sweep(path)`` of ``cpkv sweep --resume``; ``plan_sweep`` of ``--dry-run``.
Modules: ``grid`` (sweep syntax, cartesian/zip expansion), ``plan`` (validated points),
``executors`` (serial, process, ray), ``store`` (sweep.yaml, summary), ``run``, ``listing``
(a run-or-sweep target read back, and ``cpkv ls``).

May import: ``cpkv.core``, ``cpkv.runs``; capabilities only through the kinds registry.
"""

from cpkv.sweep.executors import EXECUTORS
from cpkv.sweep.plan import Point, SweepPlan, plan_sweep
from cpkv.sweep.run import SweepResult, resume_sweep, run_sweep
from cpkv.sweep.store import PointResult

__all__ = [
    "EXECUTORS",
    "Point",
    "PointResult",
    "SweepPlan",
    "SweepResult",
    "plan_sweep",
    "resume_sweep",
    "run_sweep",
]
