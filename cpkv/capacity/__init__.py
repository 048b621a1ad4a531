"""Capacity search: the highest load at which a serving config meets its SLO (``cpkv capacity``).

``run_capacity(config, overrides)`` is the programmatic twin of ``cpkv capacity``;
``resume_capacity(path)`` of ``cpkv capacity --resume``. Modules: ``bracket`` (the pure
bracketing-then-bisection search), ``plan`` (the config, the load key, the second axis and the
settings, checked up front), ``store`` (``capacity.yaml``, ``capacity.json``, the tables),
``run`` (rounds of points on the sweep executors, resume).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.sweep`` (capabilities only through the kinds
registry and the resolved config).
"""

from cpkv.capacity.bracket import LoadSearch
from cpkv.capacity.plan import CapacitySpec, SearchPlan, plan_search
from cpkv.capacity.run import CapacityResult, resume_capacity, run_capacity

__all__ = [
    "CapacityResult",
    "CapacitySpec",
    "LoadSearch",
    "SearchPlan",
    "plan_search",
    "resume_capacity",
    "run_capacity",
]
