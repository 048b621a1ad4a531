"""``--no-plots`` and ``CPKV_PLOTS=0`` reach every point of a sweep, in worker processes too."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")


def test_no_plots_travels_to_worker_processes(cli, tmp_path: Path) -> None:
    cli.plots = True  # CPKV_PLOTS=1 here: only the option says no
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kind: admit\nname: p\nadmit: {mode: serving}\nsweep:\n  seed: [1, 2]\n")
    res = cli("sweep", str(cfg), "--jobs", "2", "--no-plots")
    assert res.exit_code == 0, res.output
    points = sorted(p.parent for p in cli.root.rglob("results.json"))
    assert len(points) == 2 and not any((p / "plots").exists() for p in points)
    res = cli("sweep", str(cfg), "seed=3")  # without the option a serving point draws its plots
    assert res.exit_code == 0, res.output
    (drawn,) = [p.parent for p in cli.root.rglob("results.json") if p.parent not in points]
    assert (drawn / "plots" / "kv_utilization.png").is_file()
