"""`cpkv diff A B --rerun`: both configs run again, interleaved A, B, A, B, ... with their own
seeds, judged in pairs; refused in one line for what cannot be re-run here.

The runs are a tiny host-allocator config (a 512-page pool, two cases, six samples): the
tests check the structure and the order of what ran, never a timing (the factor is set out
of reach where a verdict is asserted)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cpkv.core.errors import InputError
from cpkv.diff.render import render_diff
from cpkv.diff.rerun.runs import RERUN_FILE, rerun_paths
from cpkv.runs.results import RunOutput, metric, samples
from tests.diff.test_serving import SEED_BLOCKS

TINY_HOST = {
    "kind": "alloc_host",
    "name": "tiny-host",
    "seed": 3,
    "alloc_host": {
        "host_sizes_gb": [],
        "host_pages": [512],
        "page_size": 16,
        "request_pages": [8],
        "patterns": ["random_fragmented"],
        "methods": ["fifo", "contiguous"],
        "impls": ["fast"],
        "ops": ["alloc"],
        "protocol": "warm",
        "repeat": 6,
        "warmup": 1,
    },
}
OUT_OF_REACH = ["--factor", "1000", "--metric", "p50_us", "--metric", "mean_us"]


def two_runs(cli, tmp_path: Path) -> tuple[Path, Path]:
    """A (seed 3) and B (seed 4) of the tiny config, in that order."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_HOST))
    for seed in (3, 4):
        res = cli("alloc", "host", str(config), f"seed={seed}")
        assert res.exit_code == 0, res.output
    a, b = cli.run_dirs()
    return a, b


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_rerun_runs_interleaved_with_each_sides_seed(cli, tmp_path: Path) -> None:
    a, b = two_runs(cli, tmp_path)
    before = files_under(cli.root)
    keep = tmp_path / "keep"
    res = cli("diff", str(a), str(b), "--rerun", "--rounds", "3", "-o", str(keep), *OUT_OF_REACH)
    assert res.exit_code == 0, res.output
    assert files_under(cli.root) == before  # nothing written beside A and B
    (folder,) = [p.parent for p in keep.rglob(RERUN_FILE)]
    doc = json.loads((folder / RERUN_FILE).read_text())
    assert doc["rounds"] == 3 and (doc["a"], doc["b"]) == (str(a), str(b))
    order = [(r["round"], r["side"]) for r in doc["runs"]]
    assert order == [(1, "A"), (1, "B"), (2, "A"), (2, "B"), (3, "A"), (3, "B")]
    # each run started after the one before it had ended, as their meta.json say
    metas = [json.loads((Path(r["path"]) / "meta.json").read_text()) for r in doc["runs"]]
    assert all(m["status"] == "complete" for m in metas)
    for before_run, after_run in zip(metas, metas[1:], strict=False):
        assert before_run["end_utc"] <= after_run["start_utc"]
    # A's rounds ran A's config (seed 3), B's rounds B's (seed 4)
    seeds = {r["side"]: set() for r in doc["runs"]}
    for r in doc["runs"]:
        seeds[r["side"]].add(yaml.safe_load((Path(r["path"]) / "config.yaml").read_text())["seed"])
    assert seeds == {"A": {3}, "B": {4}}
    lines = res.output.splitlines()
    assert lines[3] == (f"re-run here: 3 rounds, interleaved A, B, A, B, ... (6 runs, in {folder})")
    assert "- seed: 3 -> 4" in lines
    assert "summary (A -> B):" not in res.output  # the rows measured in pairs decide
    assert any(ln.startswith("rows (A, B: geometric means over 3 rounds") for ln in lines)
    assert "2 matched, 0 only in A, 0 only in B" in res.output
    assert lines[-1] == "verdict: no significant change over 3 interleaved rounds"


def test_rerun_without_o_leaves_nothing(cli, tmp_path: Path, monkeypatch) -> None:
    a, b = two_runs(cli, tmp_path)
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = files_under(cli.root)
    res = cli("diff", str(a), str(b), "--rerun", "--rounds", "3", "-f", "json", output=False)
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.output)
    assert doc["rerun"]["kept"] is None and len(doc["rerun"]["runs"]) == 6
    assert all(Path(r["path"]).parent.parent == tmp_path / "tmp" for r in doc["rerun"]["runs"])
    assert not list((tmp_path / "tmp").iterdir())  # the temporary folder is gone
    assert files_under(cli.root) == before
    assert (res.exit_code == 1) == doc["regression"]


def test_json_says_what_the_text_says(cli, tmp_path: Path) -> None:
    a, b = two_runs(cli, tmp_path)
    d = rerun_paths(str(a), str(b), rounds=3, out=tmp_path / "keep")
    text, doc = render_diff(d, "text"), json.loads(render_diff(d, "json"))
    lines = text.splitlines()
    assert f"verdict: {doc['verdict']}" == lines[-1]
    assert doc["rerun"]["rounds"] == 3 and f"{len(doc['rerun']['runs'])} runs" in lines[3]
    assert doc["rerun"]["kept"] in lines[3] and doc["factor"] == 1.1
    assert doc["rule"].startswith("each side ran its config in rounds")
    counts = doc["counts"]
    (tally,) = [ln for ln in lines if " rows compared: " in ln]
    for verdict in ("worse", "better", "noise", "info"):
        assert (f"{counts[verdict]} {verdict}" in tally) == bool(counts[verdict]), tally
    paired = [c for c in doc["changes"] if c["rounds"]]
    assert paired and all(len(c["rounds"]) == 3 and c["p_value"] is not None for c in paired)
    assert doc["rerun"]["tests"] == len(paired)
    beyond = [c for c in paired if c["rule"] == "paired"]
    if beyond:
        assert f"{len(beyond)} by a paired t-test of log(B/A) over 3 rounds" in text
    assert doc["regression"] == lines[-1].startswith("verdict: REGRESSION")


def test_a_serving_run_is_refused(cli, tmp_path: Path) -> None:
    a, _ = two_runs(cli, tmp_path)
    res = cli("admit", *SEED_BLOCKS)
    assert res.exit_code == 0, res.output
    serving = next(p for p in cli.run_dirs() if p not in (a,) and "tiny-host" not in p.name)
    for pair in ((serving, serving), (a, serving)):
        res = cli("diff", *map(str, pair), "--rerun", output=False)
        assert res.exit_code == 2, res.output
        (line,) = res.output.strip().splitlines()
        assert line.startswith(f"cpkv: error: {serving}: kind 'admit' has no timings")
        assert "--rerun is for timed kinds (alloc_host, alloc_l1)" in line


def test_a_run_without_its_config_is_refused(cli, tmp_path: Path) -> None:
    a, b = two_runs(cli, tmp_path)
    (b / "config.yaml").unlink()
    res = cli("diff", str(a), str(b), "--rerun", output=False)
    assert res.exit_code == 2
    assert (
        res.output.strip()
        == f"cpkv: error: {b}: has no config.yaml, so --rerun has nothing to run again"
    )


def test_bad_options_are_refused_before_anything_runs(cli, tmp_path: Path) -> None:
    a, _ = two_runs(cli, tmp_path)
    out = tmp_path / "out"
    for args, words in (
        (["--rounds", "2"], "--rounds 2: at least 3"),
        (["--alpha", "1.5"], "--alpha 1.5"),
        (["--metric", "nope"], "--metric nope: not a metric of kind alloc_host"),
        (["--ignore", "nope"], "--ignore nope: not an identity column"),
    ):
        res = cli("diff", str(a), str(a), "--rerun", "-o", str(out), *args, output=False)
        assert res.exit_code == 2 and words in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_a_cuda_config_is_refused_on_a_cpu_machine(cli, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the config can run here")
    a, _ = two_runs(cli, tmp_path)
    gpu = tmp_path / "gpu"
    res = cli(
        "alloc", "l1", "alloc_l1.physical_pages=[256]", "alloc_l1.cp_size=2", "alloc_l1.page_size=16",
        "alloc_l1.request_pages=[8]", "alloc_l1.impls=[fifo]", "alloc_l1.ops=[alloc_pages]",
        "alloc_l1.repeat=5", "alloc_l1.warmup=1", "-o", str(gpu),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run,) = [p.parent for p in gpu.rglob("meta.json")]
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["alloc_l1"]["device"] = "cuda"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    res = cli("diff", str(run), str(run), "--rerun", output=False)
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"cpkv: error: A ({run}) cannot be re-run here: alloc_l1.device: 'cuda'")


# -- a timed kind that reads an input file ------------------------------------------------------


@dataclass(frozen=True)
class FileBlock:
    path: str = ""


@dataclass(frozen=True)
class FileConfig:
    kind: str = "timedfile"
    name: str = "timed-file"
    seed: int = 0
    timedfile: FileBlock = field(default_factory=FileBlock)


@dataclass(frozen=True)
class FileRow:
    case: str
    p50_us: float = metric(unit="us", timing=True)
    samples_us: tuple[float, ...] = samples()


def prepare_file(cfg: FileConfig):
    if not Path(cfg.timedfile.path).is_file():
        raise InputError(f"timedfile.path: {cfg.timedfile.path}: no such file")

    def execute(ctx):
        values = [float(v) for v in Path(cfg.timedfile.path).read_text().split()]
        return RunOutput(rows=[FileRow("one", sorted(values)[len(values) // 2], tuple(values))])

    return execute


@pytest.fixture
def timed_file_kind():
    from cpkv.core.kinds import KINDS, KindSpec

    spec = KindSpec(name="timedfile", command="(tests)", config=f"{__name__}:FileConfig",
                    prepare=f"{__name__}:prepare_file", summary="timed kind with an input",
                    block="timedfile", timed=True, input_files=("timedfile.path",))  # fmt: skip
    KINDS.register("timedfile", spec)
    yield spec
    KINDS._entries.pop("timedfile", None)
    KINDS._help.pop("timedfile", None)


def test_a_missing_input_file_is_refused(timed_file_kind, cli, tmp_path: Path) -> None:
    from cpkv.core.config import load_config
    from cpkv.runs.runner import run_experiment

    data = tmp_path / "samples.txt"
    data.write_text("1 2 3 4 5 6")
    loaded = load_config("timedfile", None, [f"timedfile.path={data}"])
    run = run_experiment(loaded, tmp_path / "exp", plots=False).path
    other = run_experiment(loaded, tmp_path / "exp", plots=False).path
    res = cli(
        "diff", str(run), str(other), "--rerun", "--rounds", "3", "--factor", "1000", output=False
    )
    assert res.exit_code == 0, res.output  # re-runnable while its input is there
    data.unlink()
    res = cli("diff", str(run), str(other), "--rerun", output=False)
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert (
        line
        == f"cpkv: error: A ({run}) cannot be re-run here: timedfile.path: {data}: no such file"
    )


def test_runs_of_two_commits_get_a_note(cli, tmp_path: Path) -> None:
    """The rerun measures this checkout: A's and B's own commits are not what ran."""
    a, b = two_runs(cli, tmp_path)
    for run, commit in ((a, "fedcba9876543210"), (b, "0123456789abcdef")):
        meta = json.loads((run / "meta.json").read_text())
        meta["git"] = {"commit": commit, "dirty": False}
        (run / "meta.json").write_text(json.dumps(meta))
    res = cli("diff", str(a), str(b), "--rerun", "--rounds", "3", *OUT_OF_REACH, output=False)
    assert res.exit_code == 0, res.output
    (note,) = [ln for ln in res.output.splitlines() if ln.startswith("note: ")]
    assert "fedcba9876 and 0123456789" in note and "ran both configs with this checkout" in note
