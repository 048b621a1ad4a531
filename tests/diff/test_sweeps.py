"""`cpkv diff` of two sweeps: points matched on kind, config and swept values."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cpkv.diff.compare import diff_paths
from cpkv.sweep import run_sweep
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)


def test_sweeps_point_by_point(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = tmp_path / "e.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"kind": "sweeptest", "name": "echo", "sweep": {"sweeptest.scale": [1.0, 2.0]}}
        )
    )
    a = run_sweep([str(cfg)], root=tmp_path / "a").path
    b = run_sweep([str(cfg)], ["sweeptest.tags=[a],[a,b]"], root=tmp_path / "b").path
    c = run_sweep([str(cfg)], root=tmp_path / "c").path
    # same sweep twice: deterministic metrics, no change at all
    d = diff_paths(str(a), str(c))
    assert d.matched == 2 * 3 and {x.verdict for x in d.changes} == {"same"} and not d.notes
    assert cli("diff", str(a), str(c), output=False).exit_code == 0
    # plant a regression in one point of C: fewer tokens (higher is better)
    point = sorted(p for p in c.iterdir() if p.name.startswith("001_"))[0]
    doc = json.loads((point / "results.json").read_text())
    doc["rows"][2]["tokens"] = 1.0
    (point / "results.json").write_text(json.dumps(doc))
    res = cli("diff", str(a), str(c), output=False)
    assert res.exit_code == 1, res.output
    # the point's headline (mean tokens over its rows) and its row: both worse (higher is better)
    assert "echo_scale=2.0  mean_tokens" in res.output
    assert "echo_scale=2.0  2       60 -> 1 (-98.3%)  worse" in res.output
    assert res.output.splitlines()[-1] == (
        "verdict: REGRESSION (summary: 1 worse (mean_tokens); rows: 1 of 6 worse)"
    )
    # B swept another key too: its points do not match A's, so nothing can be compared
    res = cli("diff", str(a), str(b), output=False)
    assert res.exit_code == 2 and "no point of this sweep matches" in res.output
    # a run and a sweep cannot be compared
    res = cli("diff", str(a), str(point), output=False)
    assert res.exit_code == 2 and "is a sweep and the other is a run" in res.output
