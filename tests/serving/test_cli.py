"""``cpkv admit`` with ``admit.mode=serving`` end to end (a slice of the Mooncake trace and
the seed's block requests), determinism, ``cpkv diff`` of two policies, the cost fit from a
file and ``cpkv fit-cost``, and bad input."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cpkv.serving.cost.model import CostModel
from tests.helpers.paths import MOONCAKE_TRACE, REPO

ROOT = REPO
CONFIG = str(ROOT / "configs/admit/serving_mooncake.yaml")
TRACE = MOONCAKE_TRACE
SLICE = [CONFIG, f"admit.workload.path={TRACE}", "admit.workload.limit=80"]

needs_trace = pytest.mark.skipif(not TRACE.is_file(), reason="the Mooncake trace is not here")


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@needs_trace
def test_serving_a_trace_slice_writes_every_file(cli) -> None:
    cli.plots = True
    res = cli("admit", *SLICE)
    assert res.exit_code == 0, res.output
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    (row,) = doc["rows"]
    assert row["requests"] == 80 and row["finished"] + row["rejected"] == 80
    assert doc["columns"]["identity"] == [] and "ttft_p99_ms" in doc["columns"]["metrics"]
    assert doc["summary"]["mode"] == "serving" and doc["summary"]["policy"] == "prefill_adder"
    reqs = lines(run / "requests.jsonl")
    assert [r["rid"] for r in reqs] == [f"r{k}" for k in range(80)]
    assert all(r["status"] in ("finished", "rejected") for r in reqs)
    # the tiered cache gave hits: requests of the slice share prefixes
    assert sum(r["l1_hit_tokens"] + r["l2_hit_tokens"] for r in reqs) > 0
    finished = [r for r in reqs if r["status"] == "finished"]
    assert all(r["ttft_ms"] >= r["queue_ms"] >= 0 and r["e2e_ms"] >= r["ttft_ms"] for r in finished)
    timeline = lines(run / "timeline.jsonl")
    assert len(timeline) == 200 and all(0 <= p["kv_used_peak_pct"] <= 100 for p in timeline)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (run / "plots/kv_utilization.png").is_file()
        assert (run / "plots/latency_cdf.png").is_file()
    assert "ttft_p99_ms" in (run / "results.txt").read_text()


@needs_trace
def test_same_config_and_seed_give_identical_rows_and_requests(cli) -> None:
    args = [
        *SLICE,
        "admit.arrivals.process=poisson",
        "admit.arrivals.rate_rps=2",
        "admit.policy=optimistic",
    ]
    assert cli("admit", *args).exit_code == 0
    assert cli("admit", *args).exit_code == 0
    assert cli("admit", *args, "seed=1").exit_code == 0
    a, b, c = cli.run_dirs()
    ra, rb = cli.results(a), cli.results(b)
    assert ra["rows"] == rb["rows"] and ra["summary"] == rb["summary"]
    for name in ("requests.jsonl", "timeline.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    # another seed draws other Poisson arrivals
    arrivals = [r["arrival_ms"] for r in lines(a / "requests.jsonl")]
    assert arrivals != [r["arrival_ms"] for r in lines(c / "requests.jsonl")]
    assert arrivals == sorted(arrivals) and 20 < arrivals[-1] / 1000 < 60  # 80 at 2/s


@needs_trace
def test_diff_lines_up_two_policies(cli) -> None:
    assert cli("admit", *SLICE).exit_code == 0
    assert cli("admit", *SLICE, "admit.policy=conservative").exit_code == 0
    a, b = cli.run_dirs()
    res = cli("diff", str(a), str(b), output=False)
    assert res.exit_code in (0, 1), res.output
    assert "admit.policy" in res.output and "ttft_p99_ms" in res.output


def test_seed_block_requests_served(cli) -> None:
    args = [str(ROOT / "configs/admit/seed004_blocks.yaml"), "admit.mode=serving"]
    path = f"admit.workload.path={ROOT / 'configs/admit/seed004_requests.jsonl'}"
    assert cli("admit", *args, path, "admit.kv.scan=first_fit").exit_code == 0
    (run,) = cli.run_dirs()
    reqs = {r["rid"]: r for r in lines(run / "requests.jsonl")}
    # conservative: A reserves 3 of the 4 blocks, B waits until A is done
    assert reqs["B"]["admitted_ms"] == reqs["A"]["finish_ms"] > 0
    assert cli.results(run)["rows"][0]["preemptions"] == 0


def test_the_snapshot_keys_are_named_only_when_set(cli) -> None:
    args = [str(ROOT / "configs/admit/seed004_blocks.yaml"), "admit.mode=serving"]
    assert cli("admit", *args).exit_code == 0
    assert cli("admit", *args, "admit.page_size=4", "admit.available_tokens=5").exit_code == 0
    plain, set_ = sorted(
        ([n for n in cli.results(run)["notes"] if "not read here" in n] for run in cli.run_dirs()),
        key=len,
    )
    assert plain == [] and len(set_) == 1
    assert set_[0].startswith("admit.available_tokens, page_size describe")


def _points(tmp_path: Path) -> tuple[Path, CostModel]:
    truth = CostModel(3000.0, 20.0, 15.0, 0.05, 131072, 40.0)
    rows = []
    for k in range(30):
        x = (k * 997 % 9000, k * 31 % 200, k * 7919 % 900000, (k * 13 % 5) * 1000)
        rows.append(
            dict(
                zip(
                    ("prefill_tokens", "decode_requests", "context_tokens", "loaded_tokens"),
                    x,
                    strict=True,
                )
            )
            | {"time_us": truth.iteration_us(*x)}
        )
    path = tmp_path / "points.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, truth


def test_cost_fitted_from_a_points_file_inside_a_run(cli, tmp_path) -> None:
    points, truth = _points(tmp_path)
    args = [
        str(ROOT / "configs/admit/seed004_blocks.yaml"),
        "admit.mode=serving",
        "admit.kv.scan=first_fit",
    ]
    path = f"admit.workload.path={ROOT / 'configs/admit/seed004_requests.jsonl'}"
    fit = ("admit.cost.kind=linear", f"admit.cost.fit_points={points}")
    assert cli("admit", *args, path, *fit).exit_code == 0
    (run,) = cli.run_dirs()
    doc = cli.results(run)
    fitted = doc["summary"]["cost_model"]
    assert fitted["prefill_token_us"] == pytest.approx(20.0, rel=1e-6)
    assert fitted["l2_load_gb_per_s"] == pytest.approx(40.0, rel=1e-6)
    assert doc["summary"]["cost_fit"]["points"] == 30
    assert any("cost model fitted to 30 points" in n for n in doc["notes"])


def test_fit_cost_command_prints_a_config_block(cli, tmp_path) -> None:
    points, truth = _points(tmp_path)
    res = cli("fit-cost", str(points), output=False)
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert out[0].startswith("# fitted to 30 points") and "admit:" in out and "  cost:" in out
    values = dict(line.strip().split(": ") for line in out if line.startswith("    "))
    assert float(values["fixed_us"]) == pytest.approx(3000.0, rel=1e-5)
    assert float(values["decode_request_us"]) == pytest.approx(15.0, rel=1e-5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time_us": -1}\n')
    res = cli("fit-cost", str(bad), output=False)
    assert res.exit_code == 2 and "bad.jsonl:1: field 'time_us' must be a number > 0" in res.output


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("admit.backend=sglang", "admit.backend: 'sglang' has no serving engine"),
        (
            "admit.kv.scan=all_or_error",
            "admit.kv.scan: all_or_error is the passes mode's one-shot check",
        ),
        ("admit.arrivals.process=hourly", "admit.arrivals.process: unknown value 'hourly'"),
        ("admit.slo.ttft_ms=0", "admit.slo.ttft_ms: must be >= 0.001"),
        (
            "admit.cost.kind=linear admit.cost.fit_points=/nonexistent/points.jsonl",
            "cannot read the cost points file",
        ),
        (
            "admit.cost.fit_points=/nonexistent/points.jsonl",
            "admit.cost.fit_points: belongs to kind linear, and this admit.cost.kind is roofline",
        ),
        ("admit.cost.tp=3", "admit.cost.tp: must divide the model's 32 attention heads, got 3"),
        ("admit.cost.model=llama-9b", "admit.cost.model: unknown model 'llama-9b'"),
        ("admit.cost.gpu=rtx-9090", "admit.cost.gpu: unknown GPU 'rtx-9090'"),
        ("admit.cost.kind=quadratic", "admit.cost.kind: unknown cost model kind 'quadratic'"),
        (
            "admit.cost.kind=linear admit.cost.tp=2",
            "admit.cost.tp: belongs to kind roofline, and this admit.cost.kind is linear",
        ),
        (
            "admit.cost.calibration.gemm_corner=2",
            "admit.cost.calibration.gemm_corner: must be <= 1",
        ),
        (
            "admit.cost.model=null",
            "admit.cost.model_shape: model is null, so model_shape must give every size; missing: layers",
        ),
    ],
)
def test_bad_serving_input_is_one_line_and_no_run(cli, override, message) -> None:
    res = cli("admit", "admit.mode=serving", *override.split())
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert cli.run_dirs() == []


def test_a_stalled_run_ends_with_exit_2_and_names_the_cause(cli) -> None:
    # chunked_prefill_size 8 below a 16-token page: no prompt chunk can ever be cut
    res = cli(
        "admit",
        "admit.mode=serving",
        "admit.kv.block_size=16",
        "admit.kv.capacity_blocks=4096",
        "admit.chunked_prefill_size=8",
    )
    assert res.exit_code == 2
    assert "cannot be admitted even into an idle KV pool" in res.output
    (run,) = cli.run_dirs()
    assert not (run / "results.json").exists()


@needs_trace
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_cpkv_plot_redraws_a_serving_run_from_its_files(cli, tmp_path) -> None:
    assert cli("admit", *SLICE).exit_code == 0
    (run,) = cli.run_dirs()
    out = tmp_path / "replot"
    res = cli("plot", str(run), "-o", str(out), output=False)
    assert res.exit_code == 0, res.output
    assert (out / "kv_utilization.png").stat().st_size > 1000
    assert (out / "latency_cdf.png").stat().st_size > 1000
