"""``cpkv validate``: a static batch priced by hand, the shipped cases and their summary, the
physical bounds (no prediction beats one, over the whole grid of shapes, GPUs, parallelism
and batches), and one-line refusals of bad cases."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from cpkv.core.errors import ConfigError
from cpkv.serving.cost.cpu import ENGINE_CPU
from cpkv.serving.cost.gpus import GPUS
from cpkv.serving.cost.model import CostModel
from cpkv.serving.cost.roofline import RooflineCost
from cpkv.serving.cost.shapes import MODELS, shape_problem
from cpkv.validate.case import read_case
from cpkv.validate.predict import bounds, predict
from cpkv.validate.report import validate
from tests.helpers.paths import CONFIGS

VALIDATION = CONFIGS / "validation"


def test_a_static_batch_by_hand() -> None:
    # the linear model: 1000 us + 30 us a prefill token + 30 us a decoding request + 0.04 us
    # a context token. 2 prompts of 3 tokens, 3 outputs: a prefill of 6 tokens reading 6
    # context tokens = 1000 + 180 + 0.24; decode steps of 2 requests reading 2*(3+1) and
    # 2*(3+2) context tokens = 1060.32 and 1060.40
    got = predict(CostModel(1000.0, 30.0, 30.0, 0.04, 1024, None), 2, 3, 3, gpus=2)
    prefill, steps = 1180.24, (1060.32, 1060.40)
    assert got.prefill_us == pytest.approx(prefill, rel=1e-12)
    assert got.decode_us == pytest.approx((steps[0], steps[1], sum(steps)), rel=1e-12)
    latency = prefill + sum(steps)
    assert got.metrics == pytest.approx({
        "ttft_ms": prefill / 1000, "tpot_ms": sum(steps) / 2 / 1000, "latency_ms": latency / 1000,
        "output_tokens_per_s": 6 / (latency / 1e6),
        "output_tokens_per_s_per_gpu": 3 / (latency / 1e6),
    }, rel=1e-12)  # fmt: skip
    assert "tpot_ms" not in predict(CostModel(), 1, 8, 1, gpus=1).metrics


def test_the_bounds_by_hand() -> None:
    # Llama-2-7B on one A100: 6,738,149,376 weights through which a token goes (LM head
    # included), 2 B each, at 2,039 GB/s: 6.609 ms a decode step before any KV; a 128-token
    # prefill's 2 x (weights - LM head) x 128 FLOPs at 312 TFLOP/s
    m = RooflineCost(MODELS.get("llama-2-7b"), GPUS.get("a100-80gb"))
    weights = 32 * (4096 * 3 * 4096 + 4096 * 4096 + 3 * 4096 * 11008) + 4096 * 32000
    least = bounds(m, 1, 128, 2)
    assert least["prefill"] == pytest.approx(2 * (weights - 4096 * 32000) * 128 / 312e6)
    kv = 129 * 524288  # the first decode step reads 128 + 1 tokens of 512 KiB
    assert least["first_decode"] == pytest.approx((weights * 2 + kv) / 2039e3)


def test_the_shipped_cases_and_their_summary() -> None:
    report = validate([VALIDATION])
    files = sorted(VALIDATION.glob("*.yaml"))
    assert len(files) >= 10 and len(report.rows) == len(files)
    errors = [abs(r["error_pct"]) for r in report.rows]
    assert report.median_pct == pytest.approx(statistics.median(errors), abs=0.01)
    assert report.worst_pct == max(errors)
    assert not report.violations
    for path in files:  # each case says where its number comes from
        case = read_case(path)
        assert case.source.startswith("https://") and case.setup


def test_the_command_prints_the_table_and_the_summary(cli) -> None:
    res = cli("validate", str(VALIDATION / "gpt_fast_llama2_7b_a100_tp1.yaml"), output=False)
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("gpt-fast"))
    assert row.split()[:3] == ["gpt-fast-llama2-7b-a100-tp1", "output_tokens_per_s", "104.90"]
    assert "1 published numbers: median |error|" in res.output
    assert "no prediction beats its physical bound" in res.output


def test_a_prediction_below_its_bound_fails_the_command(cli, monkeypatch) -> None:
    monkeypatch.setattr(RooflineCost, "batch_us", lambda self, *args: 1.0)
    res = cli("validate", str(VALIDATION / "gpt_fast_llama2_7b_a100_tp1.yaml"), output=False)
    assert res.exit_code == 1
    assert "below the physical bound" in res.output


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: x\nsource: s\nsetup: s\npublished: {speed: 3}\n", "published: unknown value 'speed'"),
        ("name: x\nsource: s\nsetup: s\npublished: {ttft_ms: -3}\n", "published.ttft_ms: must be > 0"),
        ("name: x\nsetup: s\npublished: {ttft_ms: 3}\n", "source: must say it"),
        ("name: x\nsource: s\nsetup: s\nbatch: 0\npublished: {ttft_ms: 3}\n", "batch: must be >= 1"),
        ("name: x\nsource: s\nsetup: s\npublished: {ttft_ms: 3}\ncost: {ep: 2}\n",
         "cost.ep: expert parallelism needs experts"),
        ("name: x\nsource: s\nsetup: s\npublished: {tpot_ms: 3}\noutput_tokens: 1\n",
         "needs a decode iteration"),
    ],
)  # fmt: skip
def test_a_bad_case_is_refused_in_one_line(cli, tmp_path: Path, text, says) -> None:
    case = tmp_path / "case.yaml"
    case.write_text(text)
    res = cli("validate", str(case), output=False)
    assert res.exit_code == 2, res.output
    assert says in res.output and res.output.count("\n") == 1
    with pytest.raises(ConfigError):
        validate([case])


def grid():
    """Every registered model on every GPU, at each TP that fits it (with and without expert
    parallelism, with two pipeline stages), with and without the engines' CPU work."""
    for name in MODELS:
        shape = MODELS.get(name)
        for gpu in GPUS:
            for tp in (1, 2, 4, 8):
                if shape_problem(shape, tp) is not None:
                    continue
                for ep in {1, tp} if shape.moe and shape.experts % tp == 0 else {1}:
                    for pp in (1, 2):
                        yield name, gpu, tp, ep, pp


@pytest.mark.parametrize(("name", "gpu", "tp", "ep", "pp"), list(grid()))
def test_no_prediction_beats_a_physical_bound_anywhere(name, gpu, tp, ep, pp) -> None:
    cpu = ENGINE_CPU["sglang"] if (tp + pp) % 2 else ENGINE_CPU["none"]
    m = RooflineCost(MODELS.get(name), GPUS.get(gpu), tp, cpu=cpu, pp=pp, ep=ep,
                     allreduce="sglang")  # fmt: skip
    for batch in (1, 8, 64, 512):
        for prompt in (16, 2048):
            got = predict(m, batch, prompt, 3, tp * pp)
            least = bounds(m, batch, prompt, 3)
            assert got.prefill_us >= least["prefill"], (batch, prompt)
            assert got.decode_us[0] >= least["first_decode"], (batch, prompt)
            assert got.decode_us[1] >= least["last_decode"], (batch, prompt)
