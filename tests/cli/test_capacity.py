"""``cpkv capacity`` from the command line, and the other commands on a search directory."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import closed_form as cf


def search_dir(root: Path) -> Path:
    (path,) = [p.parent for p in root.rglob("capacity.yaml")]
    return path


def test_the_command_prints_the_curve_the_table_and_the_path(cli, tmp_path: Path) -> None:
    res = cli("capacity", str(cf.write_config(tmp_path / "case")), "--tolerance", "0.05")
    assert res.exit_code == 0, res.output
    path = search_dir(cli.root)
    text = (path / "capacity.txt").read_text()
    assert res.output.endswith(text + f"{path}\n")  # the tables, then the directory
    doc = json.loads((path / "capacity.json").read_text())
    (search,) = doc["searches"]
    # speedup 1 (100 req/s) misses, 0.5 (= R) meets, then bisection in [0.5, 1] to 5%:
    # sqrt(0.5) = 0.70711, sqrt(0.5 * 0.70711) = 0.59460, sqrt(0.5 * 0.5946) = 0.54525,
    # sqrt(0.5 * 0.54525) = 0.52214 (misses; 0.52214 / 0.5 = 1.044 <= 1.05: done)
    assert [p["load"] for p in search["points"]] == [1.0, 0.5, 0.70711, 0.5946, 0.54525, 0.52214]
    assert [p["met"] for p in search["points"]] == [False, True, False, False, False, False]
    assert search["capacity_load"] == 0.5 and search["outcome"] == "found"
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("capacity_speedup"))
    assert lines[header + 2].split()[:4] == ["0.5", "50.00", "50.00", "[0.5,"]
    assert "load 0.5 (50 req/s): attainment 100.0% meets" in res.output  # progress on stderr


def test_the_plot_is_drawn(cli, tmp_path: Path) -> None:
    cli.plots = True
    res = cli(
        "capacity", str(cf.write_config(tmp_path / "case")), "admit.cost.fixed_us=20000,10000"
    )
    assert res.exit_code == 0, res.output
    path = search_dir(cli.root)
    png = path / "plots" / "capacity.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(path.glob("0*/plots"))  # points draw no plots of their own


def test_ls_show_plot_and_diff_read_a_search(cli, tmp_path: Path) -> None:
    res = cli("capacity", str(cf.write_config(tmp_path / "case")), "--tolerance", "0.05")
    assert res.exit_code == 0
    path = search_dir(cli.root)
    listing = cli("ls", str(cli.root), output=False)
    assert "capacity-closed-form" in listing.output and "complete" in listing.output
    shown = cli("show", str(path), output=False)
    assert shown.exit_code == 0 and "6 points: 6 complete" in shown.output
    points = sorted(p for p in path.iterdir() if p.is_dir() and p.name[0].isdigit())
    diff = cli("diff", str(points[1]), str(points[0]), output=False)  # 0.5 vs 1.0: worse
    assert diff.exit_code == 1 and "verdict: REGRESSION" in diff.output
    drawn = cli("plot", str(path), "-o", str(tmp_path / "plots"), output=False)
    assert drawn.exit_code == 0 and str(tmp_path / "plots" / "capacity.png") in drawn.output


def test_a_search_is_resumed_by_capacity_not_by_sweep(cli, tmp_path: Path) -> None:
    cli("capacity", str(cf.write_config(tmp_path / "case")), "--tolerance", "0.05")
    path = search_dir(cli.root)
    res = cli("sweep", "--resume", str(path), output=False)
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"cpkv: error: {path}: is a capacity search; continue it with `cpkv capacity --resume {path}`"
    )
    again = cli("capacity", "--resume", str(path), output=False)
    assert again.exit_code == 0 and "resuming: 6 point(s) already complete" in again.output
    wrong = cli("capacity", "--resume", str(path), "--tolerance", "0.1", output=False)
    assert wrong.exit_code == 2 and "--resume SEARCH_DIR takes no config" in wrong.output
