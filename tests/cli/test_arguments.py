"""The argument rules: an argument naming an existing file is a file even with ``=`` in it (a
sweep point's directory name holds ``=``), so a point re-runs as the README says."""

from __future__ import annotations

from pathlib import Path

from cpkv.cli.common import split_args
from tests.hostile.faults import rows_without_timing


def test_a_sweep_point_config_reruns_as_a_single_run(cli, tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kind: admit\nname: s\nsweep:\n  admit.page_size: [1, 16]\n")
    assert cli("sweep", str(cfg)).exit_code == 0
    (point,) = [p for p in cli.root.rglob("001_s_page_size=16") if p.is_dir()]
    before = set(cli.run_dirs())
    res = cli("admit", str(point / "config.yaml"), "--no-plots")
    assert res.exit_code == 0, res.output
    (again,) = set(cli.run_dirs()) - before
    assert rows_without_timing(again) == rows_without_timing(point)  # the same point, re-run
    # a config whose path holds '=' also takes overrides, and sweeps take it as a config too
    res = cli(
        "admit", str(point / "config.yaml"), "admit.page_size=1", "--print-config", output=False
    )
    assert res.exit_code == 0 and "page_size: 1\n" in res.output
    res = cli("sweep", str(point / "config.yaml"), "seed=1,2", "--dry-run", output=False)
    assert res.exit_code == 0 and "2 points" in res.output


def test_split_args(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a=b.yaml").write_text("kind: admit\n")
    assert split_args(["a=b.yaml", "x=1"]) == ("a=b.yaml", ["x=1"])
    assert split_args(["c=d.yaml", "x=1"]) == (None, ["c=d.yaml", "x=1"])  # no such file: KEY=VALUE
    assert split_args(["cfg.yaml", "x=1"]) == ("cfg.yaml", ["x=1"])
