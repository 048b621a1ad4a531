"""The shipped configs as sweeps: the quick suite covers every kind, every config checks on a
fresh checkout, a point that cannot run here is skipped (not failed), names stay short."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import yaml

from cpkv.runs.rundir import NAME_LIMIT, RunDir, safe_name
from cpkv.sweep import plan_sweep
from cpkv.sweep.check import OK, SKIP, check_point
from cpkv.sweep.plan import NAME_LIMIT as POINT_LIMIT
from tests.helpers.paths import MOONCAKE_TRACE, REPO
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)


def configs(pattern: str) -> list[str]:
    return sorted(glob.glob(str(REPO / pattern)))


def test_the_quick_suite_has_one_config_per_kind_and_mode(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    plan = plan_sweep(sorted(glob.glob("configs/*.yaml")))
    kinds = {p.kind for p in plan.points}
    assert kinds == {"admit", "alloc_host", "alloc_l1", "trace_stats", "trace_curve"}
    admit = {(p.config["admit"]["mode"], p.config["admit"]["workload"]["source"])
             for p in plan.points if p.kind == "admit"}  # fmt: skip
    assert admit == {
        ("passes", "grid"),
        ("passes", "jsonl"),
        ("passes", "trace"),
        ("serving", "trace"),
    }
    assert all(p.config.get("alloc_l1", {}).get("device", "cpu") == "cpu" for p in plan.points)
    assert len(plan.points) == 8 and plan.name == "admit-grid+7-more"


def test_every_shipped_config_checks_on_a_fresh_checkout(monkeypatch) -> None:
    """configs/*/*.yaml (the experiments: configs/validation holds `cpkv validate`'s cases, not
    runs): every point's prepare (files, devices, packages) passes, except the
    CUDA config, which is skipped on a machine without CUDA; nothing needs a file that is not
    shipped (the trace lives in ../shared/data beside the checkout)."""
    if not MOONCAKE_TRACE.is_file():
        pytest.skip(f"trace not found at {MOONCAKE_TRACE}")
    monkeypatch.chdir(REPO)
    experiments = [
        p for p in glob.glob("configs/*/*.yaml") if not p.startswith("configs/validation/")
    ]
    plan = plan_sweep(sorted(experiments))
    first = {}
    for point in plan.points:  # one point of each config (the others differ in swept values)
        first.setdefault(point.source, point)
    checks = {src: check_point(p) for src, p in first.items()}
    import torch

    cuda = torch.cuda.is_available()
    for src, check in checks.items():
        if src == "configs/perf/l1_cuda.yaml" and not cuda:
            assert check.status == SKIP and "CUDA is not available" in check.reason
        else:
            assert check.status == OK, (src, check.reason)
    assert all(len(p.name) <= POINT_LIMIT for p in plan.points)


def test_a_point_that_cannot_run_here_is_skipped_with_its_reason(
    cli,
    tmp_path: Path,
    fake_kind,  # noqa: F811
) -> None:
    cfg = tmp_path / "e.yaml"
    cfg.write_text(yaml.safe_dump({"kind": "sweeptest", "name": "echo",
                                   "sweep": {"sweeptest.needs_device": [False, True]}}))  # fmt: skip
    res = cli("sweep", str(cfg), "--dry-run")
    assert res.exit_code == 0, res.output
    assert (
        "001_echo_needs_device=true: would be skipped: sweeptest.needs_device: this machine has no such device"
        in res.output
    )
    assert not cli.root.exists()  # the dry run wrote nothing
    res = cli("sweep", str(cfg))
    assert res.exit_code == 0, res.output  # skipped is not failed
    (sweep,) = [p.parent for p in cli.root.rglob("sweep.yaml")]
    doc = json.loads((sweep / "summary.json").read_text())
    assert [p["status"] for p in doc["points"]] == ["complete", "skipped"]
    assert doc["status"] == "complete" and doc["counts"]["skipped"] == 1
    assert not (sweep / doc["points"][1]["name"]).exists()  # nothing ran, nothing was written
    text = (sweep / "summary.txt").read_text()
    assert "not complete" in text and "no such device" in text
    assert text.splitlines()[-1] == "sweep echo: 2 points: 1 complete, 1 skipped"
    # --resume tries it again and skips it again: still exit 0, not a failure
    res = cli("sweep", "--resume", str(sweep), output=False)
    assert res.exit_code == 0, res.output
    assert json.loads((sweep / "summary.json").read_text())["points"][1]["status"] == "skipped"
    # a diff of two such sweeps compares what ran and names what did not
    res = cli("diff", str(sweep), str(sweep), output=False)
    assert res.exit_code == 0, res.output
    assert (
        "note: point 001_echo_needs_device=true not compared: skipped in A, skipped in B"
        in res.output
    )


def test_a_point_that_would_fail_makes_the_dry_run_exit_1(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, -1.0]}}
        )
    )
    res = cli("sweep", str(cfg), "--dry-run")
    assert res.exit_code == 1
    assert "001_echo_scale=-1.0: would fail: sweeptest.scale: must be >= 0, got -1.0" in res.output
    assert "2 points: 2 to run (1 ok, 0 would be skipped, 1 would fail)" in res.output
    assert not cli.root.exists()


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch is not installed"
)
def test_the_cuda_config_is_skipped_without_cuda(cli, monkeypatch) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the config runs")
    monkeypatch.chdir(REPO)
    res = cli("sweep", "configs/perf/l1_cuda.yaml")
    assert res.exit_code == 0, res.output
    assert "skipped" in res.output and "CUDA is not available here" in res.output


def test_names_stay_short_whatever_is_swept(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    long_tags = ",".join(f"[{'t' * 40}{i}]" for i in range(3))
    names = []
    for i in range(6):
        cfg = tmp_path / f"c{i}.yaml"
        cfg.write_text(
            yaml.safe_dump({"kind": "sweeptest", "name": f"a-rather-long-config-name-{i}"})
        )
        names.append(str(cfg))
    res = cli("sweep", *names, f"sweeptest.tags={long_tags}", "sweeptest.scale=1.0,2.0")
    assert res.exit_code == 0, res.output
    (sweep,) = [p.parent for p in cli.root.rglob("sweep.yaml")]
    assert sweep.name.endswith("_sweep-a-rather-long-config-name-0+5-more")
    points = [p for p in sweep.iterdir() if p.is_dir()]
    assert len(points) == 36 and all(len(p.name) <= POINT_LIMIT for p in points)
    assert len({p.name for p in points}) == 36
    # a very long --name: the directory keeps its start and a hash
    res = cli("sweep", names[0], "--name", "x" * 300)
    assert res.exit_code == 0, res.output
    assert (
        max(len(p.name) for p in cli.root.rglob("*_sweep-x*"))
        <= len("HH-MM-SS-ffffff_") + NAME_LIMIT
    )
    assert safe_name("y" * 300) == safe_name("y" * 300) != safe_name("y" * 299)
    assert len(RunDir.create(tmp_path / "runs", "z" * 500, {}).path.name) <= 16 + NAME_LIMIT
