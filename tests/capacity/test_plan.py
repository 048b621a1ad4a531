"""Bad input to a capacity search: one line naming what is missing, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import closed_form as cf


def edit(path: Path, change) -> Path:  # noqa: ANN001
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


CASES = {
    "passes mode": (lambda d: d["admit"].update(mode="passes"), [],
                    "admit.mode is 'passes'; cpkv capacity needs admit.mode serving"),
    "no slo": (lambda d: d["admit"].update(slo={"ttft_ms": None}), [],
               "admit.slo sets no limit; cpkv capacity needs admit.slo.ttft_ms or admit.slo.tpot_ms"),
    "zero arrivals": (lambda d: d["admit"]["arrivals"].update(process="zero"), [],
                      "admit.arrivals.process is 'zero' (every request at time 0): no load to search"),
    "two axes": (lambda d: None, ["admit.policy=prefill_adder,conservative", "seed=1,2"],
                 "cpkv capacity takes one second axis (one key with a list of values); got admit.policy, seed"),
    "load as axis": (lambda d: None, ["admit.arrivals.speedup=1,2"],
                     "admit.arrivals.speedup is the load the search varies; it cannot be the second axis"),
    "bad attainment": (lambda d: d.update(capacity={"attainment": 90}), [],
                       "capacity.attainment: must be a fraction in (0, 1] (0.9 for 90% of requests), got 90"),
    "bad override": (lambda d: None, ["capacity.tolerance=0"],
                     "override 'capacity.tolerance=0': capacity.tolerance: must be a relative width"),
    "unknown setting": (lambda d: None, ["capacity.tolerence=0.1"],
                        "override 'capacity.tolerence=0.1': capacity.tolerence: unknown key; did you mean 'tolerance'?"),
    "max requests of jsonl": (lambda d: None, ["capacity.max_requests=10"],
                              "max_requests caps a trace (admit.workload.limit) or the synthetic source"),
    "bad axis value": (lambda d: None, ["admit.policy=prefill_adder,fastest"],
                       "override 'admit.policy=fastest': admit.policy: unknown value 'fastest'"),
    "missing file": (lambda d: d["admit"]["workload"].update(path="nowhere.jsonl"), [],
                     "nowhere.jsonl"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_writes_nothing(cli, tmp_path: Path, case: str) -> None:
    change, overrides, message = CASES[case]
    config = edit(cf.write_config(tmp_path / "case"), change)
    res = cli("capacity", str(config), *overrides)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error: ") and message in lines[0], lines
    assert not cli.root.exists()  # no search directory, no day folder


def test_a_config_of_another_kind_is_refused(cli, tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("kind: alloc_host\nname: h\n")
    res = cli("capacity", str(path))
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"cpkv: error: {path}: kind is 'alloc_host'; cpkv capacity searches kind admit configs "
        "(admit.mode serving, with admit.slo set)"
    )


def test_a_bad_capacity_block_names_its_line(cli, tmp_path: Path) -> None:
    config = cf.write_config(tmp_path / "case", extra={"capacity": {"growth": 1.0}})
    line = config.read_text().splitlines().index("  growth: 1.0") + 1
    res = cli("capacity", str(config))
    assert res.exit_code == 2
    assert (
        res.output.strip()
        == f"cpkv: error: {config}:{line}: capacity.growth: must be in (1, 1000], got 1.0"
    )


def test_a_bad_value_of_the_files_second_axis_names_its_line(cli, tmp_path: Path) -> None:
    config = cf.write_config(
        tmp_path / "case", extra={"sweep": {"admit.policy": ["prefill_adder", "fastest"]}}
    )
    line = config.read_text().splitlines().index("  - fastest") + 1
    res = cli("capacity", str(config))
    assert res.exit_code == 2
    assert res.output.strip().startswith(
        f"cpkv: error: {config}:{line}: sweep admit.policy=fastest: admit.policy: unknown value 'fastest'"
    )


def test_flags_are_checked_like_the_block(cli, tmp_path: Path) -> None:
    res = cli("capacity", str(cf.write_config(tmp_path / "case")), "--attainment", "1.5")
    assert res.exit_code == 2
    assert "--attainment 1.5: must be a fraction in (0, 1]" in res.output


def test_one_config_is_required(cli) -> None:
    res = cli("capacity")
    assert res.exit_code == 2 and "cpkv capacity: name one config file" in res.output


def test_a_capacity_config_refuses_to_run_as_one_run(cli, tmp_path: Path) -> None:
    config = cf.write_config(tmp_path / "case", extra={"capacity": {"tolerance": 0.05}})
    res = cli("admit", str(config))
    assert res.exit_code == 2
    assert (
        f"holds a capacity: block, and `cpkv admit` runs one config; run it with `cpkv capacity {config}`"
        in res.output
    )
