"""What a serving run reports of its inter-token latency: ``results.json``'s summary
``itl_ms`` and the row's ``itl_*_ms`` columns, for one instance and for instances behind a
router (the pooled gaps of every instance; each instance's own in ``instances.jsonl``), under
every engine; held to every token's timestamp, recorded in a run of full iterations."""

from __future__ import annotations

import json

import pytest

from cpkv.core.config import load_config
from cpkv.core.kinds import RunContext
from cpkv.serving.engine import engine as engine_module
from cpkv.serving.engine import sglang_engine, vllm_engine
from cpkv.serving.model.request import FINISHED
from cpkv.serving.record import requests as requests_module
from cpkv.serving.record.itl import ItlStats
from tests.helpers.itl_truth import STATS, CpkvTokens, SglangTokens, VllmTokens, pooled, same

CONFIG = """\
kind: admit
name: itl
seed: 3
admit:
  mode: serving
  engine: {engine}
  workload:
    source: synthetic
    synthetic:
      count: 60
      l1_cached_tokens: {{choices: [0]}}
      l2_cached_tokens: {{choices: [0]}}
      extend_tokens: {{choices: [48, 300, 700]}}
      max_new_tokens: {{choices: [1, 12, 60]}}
  arrivals: {{process: poisson, rate_rps: 40}}
  cost: {{kind: linear}}
  kv: {{block_size: 16, capacity_blocks: 96}}
  cluster: {{instances: {instances}, router: round_robin}}
"""


def run(tmp_path, engine: str, instances: int):
    path = tmp_path / f"{engine}-{instances}.yaml"
    path.write_text(CONFIG.format(engine=engine, instances=instances))
    loaded = load_config("admit", str(path), [])
    return loaded.spec.prepare_fn()(loaded.experiment)(RunContext())


def record_full_iterations(monkeypatch, engine: str):
    """Every engine runs every iteration in full, its tokens stamped; the recorder, and the
    ids of the requests that finished."""
    monkeypatch.setattr(engine_module, "decode_stretches", lambda e, horizon: 0)
    monkeypatch.setattr(engine_module, "run_stretch", lambda e, horizon, bound: 0)
    monkeypatch.setattr(sglang_engine.SglangEngine, "_decode_stretch", lambda e, horizon: 0)
    monkeypatch.setattr(vllm_engine, "decode_stretches", lambda e, horizon: 0)
    stepping: list = []  # the vLLM instance whose step runs
    step = vllm_engine.VllmEngine._step

    def stepped(instance):
        stepping[:] = [instance]
        return step(instance)

    monkeypatch.setattr(vllm_engine.VllmEngine, "_step", stepped)
    finished: set[str] = set()
    done = requests_module.RequestStats.done

    def counted(stats, r, *index):
        if r.state == FINISHED:
            finished.add(r.rid)
        return done(stats, r, *index)

    monkeypatch.setattr(requests_module.RequestStats, "done", counted)
    if engine == "cpkv":
        return CpkvTokens(monkeypatch), finished
    if engine == "sglang":
        return SglangTokens(monkeypatch), finished
    return VllmTokens(monkeypatch, lambda: stepping[0].now), finished


def columns(row) -> ItlStats:
    values = [row[f"itl_{k}_ms"] if isinstance(row, dict) else getattr(row, f"itl_{k}_ms")
              for k in STATS]  # fmt: skip
    return ItlStats(0, *values)


def same_columns(row, truth) -> None:
    same(columns(row), {**truth, "gaps": 0})


@pytest.mark.parametrize("engine", ["sglang", "vllm", "cpkv"])
@pytest.mark.parametrize("instances", [1, 2])
def test_a_run_reports_the_gaps_of_its_tokens(tmp_path, monkeypatch, engine, instances):
    out = run(tmp_path, engine, instances)
    (row,) = out.rows
    assert out.summary["itl_ms"] == {k: getattr(row, f"itl_{k}_ms") for k in STATS}
    with monkeypatch.context() as patched:
        tokens, finished = record_full_iterations(patched, engine)
        reference = run(tmp_path, engine, instances)
    truth = pooled(tokens.stamps, sorted(finished))
    assert truth["gaps"] > 200
    same_columns(row, truth)
    same_columns(reference.rows[0], truth)
    if instances == 1:
        return
    where = {}  # each request's instance
    for line in out.extras["requests.jsonl"].splitlines():
        request = json.loads(line)
        where[request["rid"]] = request["instance"]
    rows = [json.loads(line) for line in out.extras["instances.jsonl"].splitlines()]
    for k, instance_row in enumerate(rows):
        mine = sorted(rid for rid in finished if where[rid] == k)
        same_columns(instance_row, pooled(tokens.stamps, mine))
