"""SGLang's loop behind a router (``admit.engine: sglang``, ``admit.cluster.instances >
1``), by the checks every engine passes (``tests/serving/engine_checks.py``): one instance
behind the driver is the plain run, float for float; each instance serves its requests as a
plain run would. The loads the ``least_tokens`` router reads from an instance are checked by
hand, in the normal and the overlap loop.
"""

from __future__ import annotations

import functools

import pytest

from cpkv.serving.engine.sglang_engine import SglangEngine, SglangSettings
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.sglang import LoopConfig
from tests.serving import engine_checks as checks

CONFIG = LoopConfig(
    max_total_num_tokens=1200, max_running_requests=8, context_len=4096, chunked_prefill_size=256
)
NORMAL = LoopConfig(
    max_total_num_tokens=1200, max_running_requests=8, context_len=4096, overlap=False
)


def engine(cost, sink, arrivals=None, config=CONFIG) -> SglangEngine:
    settings = SglangSettings(config, cost, trace_block_tokens=64)
    log = IterationLog(settings.capacity_blocks, 1, keep=True, cost=cost)
    return SglangEngine(settings, sink=sink, samples=log, arrivals=arrivals)


@pytest.mark.parametrize("cost", [checks.UNIT, checks.SHAPED], ids=["unit", "shaped"])
def test_one_instance_behind_the_driver_is_the_plain_run(cost) -> None:  # (the overlap loop)
    checks.check_one_instance_is_the_plain_run(engine, cost)


@pytest.mark.parametrize("router", checks.ROUTERS)
def test_each_instance_serves_its_requests_as_a_plain_run(router: str) -> None:
    checks.check_each_instance_serves_its_requests_as_a_plain_run(engine, router)


@pytest.mark.parametrize("config", [NORMAL, CONFIG], ids=["normal", "overlap"])
def test_least_tokens_reads_an_instance_by_hand(config) -> None:
    # Unit batches (either loop: a batch's tokens count from its end, processed or not). q0
    # (t=0.5, prompt 100, 5 tokens) -> instance 0 (a tie: the lowest): its prefill batch
    # [0.5, 1.5) gives its first token, then one decode batch a unit. q1 arrives at 3.2:
    # instance 0 ran the batches that start before 3.2 ([2.5, 3.5) is in flight, its token
    # not out): q0 holds 100 + 2 tokens; instance 1 none -> q1 to instance 1. q2 (t=3.3):
    # instance 1 took q1 in at 3.2 (its prefill [3.2, 4.2) in flight): q1 holds its 50 prompt
    # tokens; q0 still 102 -> q2 to instance 1.
    seen, instance_of = checks.least_tokens_reads(functools.partial(engine, config=config))
    assert seen[1] == [(0, 102), (0, 0)]
    assert seen[2] == [(0, 102), (0, 50)]
    assert instance_of == [0, 1, 1]


def test_a_cluster_run_writes_its_instances(cli) -> None:
    checks.check_a_cluster_run_writes_its_instances(cli, "sglang")
