"""Combinations of the admission-policy space that make no sense: exit 2, one line, no run
directory (cpkv.admit.policy_space)."""

from __future__ import annotations

import pytest

SERVING = [
    "admit.mode=serving",
    "admit.workload.source=synthetic",
    "admit.workload.synthetic.count=4",
]

REFUSED = [
    (["admit.policy=profiled"], "policy: is read only by the serving simulation"),
    (["admit.schedule_policy=deadline"], "is not applied in mode passes"),
    (["admit.serving.on_preempt=swap"], "serving.on_preempt: is read only by the serving"),
    (["admit.serving.queue_timeout_ms=5"], "serving.queue_timeout_ms: is read only"),
    (["admit.serving.check_invariants=true"], "serving.check_invariants: is read only"),
    (["admit.kv.safety_margin_blocks=1"], "kv.safety_margin_blocks: is read only"),
    (["admit.iteration.weights.decode=2"], "iteration.weights: is read only"),
    (
        [*SERVING, "admit.policy=optimistic", "admit.schedule_policy=lpm"],
        "needs policy prefill_adder",
    ),
    (
        [*SERVING, "admit.policy=conservative", "admit.enable_priority_scheduling=true"],
        "priority scheduling needs policy prefill_adder",
    ),
    ([*SERVING, "admit.iteration.weights.decode=2"], "prefill_adder budgets by SGLang's"),
    ([*SERVING, "admit.iteration.verify_tokens=2"], "prefill_adder budgets by SGLang's"),
    ([*SERVING, "admit.profiled.quantile=0.5"], "read only by policy profiled"),
    ([*SERVING, "admit.deadline.aging_ms=5"], "read only by schedule_policy deadline"),
    (
        [*SERVING, "admit.schedule_policy=deadline", "admit.enable_priority_scheduling=true"],
        "not with cpkv's deadline order",
    ),
    ([*SERVING, "admit.kv.capacity_blocks=8", "admit.kv.safety_margin_blocks=8"], "leaves none"),
    ([*SERVING, "admit.policy=profiled", "admit.profiled.quantile=1.5"], "must be in [0, 1]"),
    ([*SERVING, "admit.serving.cuda_graph_buckets=[8,4]"], "increasing order"),
    ([*SERVING, "admit.serving.queue_timeout_ms=0"], "queue_timeout_ms"),
    (
        [*SERVING, "admit.policy=optimistic", "admit.iteration.weights.prefill=0"],
        "must be >= 0.001",
    ),
]


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_nonsense_combinations_exit_2_in_one_line(cli, args, message) -> None:
    res = cli("admit", *args)
    assert res.exit_code == 2, (args, res.output)
    assert message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert cli.run_dirs() == []
