"""vLLM instances behind a router (``admit.engine: vllm``, ``admit.cluster.instances > 1``),
by the checks every engine passes (``tests/serving/engine_checks.py``): one instance behind
the driver is the plain run, float for float; each instance's requests, re-run alone through a
plain engine, get the same steps (a unit cost model makes times step counts, exact). The loads
the ``least_tokens`` router reads from a vLLM instance are checked by hand on a small case.
"""

from __future__ import annotations

import pytest

from cpkv.serving.engine.vllm_engine import VllmEngine, VllmSettings
from cpkv.serving.record.iteration_log import IterationLog
from cpkv.vllm import SchedulerConfig
from tests.serving import engine_checks as checks

CONFIG = SchedulerConfig(
    num_gpu_blocks=80, max_model_len=600, max_num_batched_tokens=256, max_num_seqs=8
)


def engine(cost, sink, arrivals=None) -> VllmEngine:
    settings = VllmSettings(CONFIG, cost, trace_block_tokens=64)
    log = IterationLog(settings.capacity_blocks, 16, keep=True, cost=cost)
    return VllmEngine(settings, sink=sink, samples=log, arrivals=arrivals)


@pytest.mark.parametrize("cost", [checks.UNIT, checks.SHAPED], ids=["unit", "shaped"])
def test_one_vllm_instance_behind_the_driver_is_the_plain_run(cost) -> None:
    checks.check_one_instance_is_the_plain_run(engine, cost)


@pytest.mark.parametrize("router", checks.ROUTERS)
def test_each_vllm_instance_serves_its_requests_as_a_plain_run(router: str) -> None:
    checks.check_each_instance_serves_its_requests_as_a_plain_run(engine, router)


def test_least_tokens_reads_a_vllm_instance_by_hand() -> None:
    # Unit steps. q0 (t=0.5, prompt 100, 5 tokens) -> instance 0 (a tie: the lowest). Its
    # steps start at 0.5, 1.5, 2.5, ...; each emits one token at its end: 1.5, 2.5, 3.5, ...
    # q1 arrives at 3.2: instance 0 ran the steps that start before 3.2 (the last, [2.5,
    # 3.5), is in flight: its token not out yet): q0 holds 100 + 2 tokens; instance 1 none
    # -> q1 to instance 1. q2 (t=3.3): instance 1 took q1 in at 3.2 (its prefill step [3.2,
    # 4.2) in flight): q1 is admitted, 50 + 0 tokens; q0 still 102 -> q2 to instance 1.
    seen, instance_of = checks.least_tokens_reads(engine)
    assert seen[1] == [(0, 102), (0, 0)]
    assert seen[2] == [(0, 102), (0, 50)]
    assert instance_of == [0, 1, 1]


def test_a_vllm_cluster_run_writes_its_instances(cli) -> None:
    checks.check_a_cluster_run_writes_its_instances(cli, "vllm")
