"""When the last request of a ``kind: admit`` run arrives: the span a load search keeps within
the simulation clock's range (:mod:`cpkv.serving.engine.clock`)."""

from __future__ import annotations

from typing import Any


def last_arrival_us(cfg: Any) -> float:
    """The last arrival (µs) of the serving run ``cfg`` (an ``AdmitConfig``): its workload
    read as the run reads it, at its own ``admit.arrivals``."""
    from cpkv.serving.engine.clock import last_arrival_us as last
    from cpkv.serving.input.workload import load_serving_workload

    block = cfg.admit
    workload = load_serving_workload(block.workload, block.max_new_tokens, cfg.seed)
    return last(workload, block.arrivals)
