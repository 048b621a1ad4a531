"""A sweep's points draw no plots of their own, wherever they run and whatever CPKV_PLOTS
says; ``--plots`` (or ``CPKV_PLOTS=1`` where the sweep starts) draws the sweep's own plots."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")


def _new_sweep(cli, seen: set[Path]) -> Path:
    (sweep,) = [p.parent for p in cli.root.rglob("sweep.yaml") if p.parent not in seen]
    seen.add(sweep)
    return sweep


def test_points_draw_no_plots_and_the_sweep_draws_its_own_when_asked(cli, tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kind: admit\nname: p\nsweep:\n  admit.available_tokens: [12000, 20000]\n")
    seen: set[Path] = set()
    cli.plots = True  # CPKV_PLOTS=1 here and in the worker processes
    assert cli("sweep", str(cfg), "--jobs", "2").exit_code == 0
    env_on = _new_sweep(cli, seen)
    assert cli("sweep", str(cfg), "--no-plots").exit_code == 0
    flag_off = _new_sweep(cli, seen)
    cli.plots = False  # CPKV_PLOTS=0
    assert cli("sweep", str(cfg), "--plots", "--jobs", "2").exit_code == 0
    flag_on = _new_sweep(cli, seen)
    assert cli("sweep", str(cfg)).exit_code == 0
    env_off = _new_sweep(cli, seen)
    for sweep in (env_on, flag_off, flag_on, env_off):
        points = [p.parent for p in sweep.rglob("results.json")]
        assert len(points) == 2 and not any((p / "plots").exists() for p in points)
    for sweep in (env_on, flag_on):
        assert (sweep / "plots" / "sweep_admit.available_tokens.png").is_file()
    for sweep in (flag_off, env_off):
        assert not (sweep / "plots").exists()
