"""Sweeps on a real Ray cluster: ``ray start --head`` on a free port (stopped after the module),
started in another folder than the sweeps, as a cluster's workers are.

Few and quick: relative input paths and CPKV_PLOTS=0 reach the workers, ``--executor ray``
without an address starts its own instance while this cluster runs, an interrupted Ray sweep
resumes to the rows of an uninterrupted one, and an open port that is not Ray is refused in
one line within seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.hostile import faults as F

pytestmark = pytest.mark.ray

CONFIG = "configs/admit/seed_jsonl.yaml"  # names its workload by a path relative to the repo
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}
"""Without it Ray 2.5x+ turns token authentication on for a new local cluster and writes a
token into ~/.ray, which then changes every later Ray cluster of this user."""


@pytest.fixture(autouse=True)
def _no_ray_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # F.env() copies os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """``HOST:PORT`` of a one-node Ray cluster started in a scratch folder; its process group
    (the head and everything it started) is stopped after the module."""
    if shutil.which("ray") is None:
        pytest.skip("the ray command is not on PATH")
    port = free_port()
    elsewhere = tmp_path_factory.mktemp("ray-head")
    env = {**F.env(), "RAY_USAGE_STATS_ENABLED": "0", **NO_AUTH}
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats"],
        cwd=elsewhere, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        from cpkv.sweep.executors import _not_ray

        assert F.wait_for(lambda: _not_ray("127.0.0.1", port, 1.0) is None, 60, 0.2), "no head"
        yield f"127.0.0.1:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(head.pid, sig)  # the group this fixture started, by its id
            except ProcessLookupError:
                break
            if sig == signal.SIGTERM:
                time.sleep(1.0)
        head.wait(10)


def serial_rows(folder: Path, *args: str) -> dict[str, list[dict]]:
    out = F.run(["sweep", *args, "-o", str(folder)], REPO)
    assert out.code == 0, out.stderr
    sweep = F.sweep_of(folder)
    assert sweep is not None
    return {p.name: F.rows_without_timing(p) for p in F.point_dirs(sweep)}


def test_relative_paths_and_no_plots_reach_the_workers(cluster: str, tmp_path: Path) -> None:
    points = ("admit.page_size=1,16",)
    expected = serial_rows(tmp_path / "serial", CONFIG, *points)
    root = tmp_path / "ray"
    env_plots = F.run(
        ["sweep", CONFIG, *points, "--executor", "ray", "--ray-address", cluster, "-o", str(root)],
        REPO,
    )  # fmt: skip  (CPKV_PLOTS=0 in F.env)
    assert env_plots.code == 0, env_plots.stderr
    sweep = F.sweep_of(root)
    assert sweep is not None
    for point in F.point_dirs(sweep):
        assert F.rows_without_timing(point) == expected[point.name]
        assert not (point / "plots").exists(), "CPKV_PLOTS=0 did not reach the worker"
        config = (point / "config.yaml").read_text()
        assert (
            str(REPO / "configs/admit/seed_jsonl_requests.jsonl") in config
        )  # resolved by the driver


def test_no_address_starts_a_fresh_local_instance_while_a_cluster_runs(
    cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "h.yaml").write_text("kind: admit\nname: local\n")
    out = F.run(["sweep", "h.yaml", "seed=1,2", "--executor", "ray", "--jobs", "2", "-o", "out"],
                tmp_path, timeout=120)  # fmt: skip
    assert out.code == 0, out.stderr
    assert "complete" in out.stdout and "2 complete" in out.stdout


def test_an_interrupted_ray_sweep_resumes_to_the_same_rows(cluster: str, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(F.SWEEP_CONFIG)
    reference = serial_rows(tmp_path / "reference", str(tmp_path / "s.yaml"))
    proc = F.start(["sweep", "s.yaml", "--executor", "ray", "--ray-address", cluster, "--jobs", "2",
                    "-o", "out"], tmp_path)  # fmt: skip
    assert F.wait_for(lambda: any((tmp_path / "out").rglob("0*_faults_*/meta.json")), 60)
    proc.send_signal(signal.SIGINT)
    out = F.finish(proc, timeout=60)
    sweep = F.sweep_of(tmp_path / "out")
    assert sweep is not None
    if out.code != 0:
        assert out.code == 130, out.stderr
        assert (
            out.stderr.strip()
            .splitlines()[-1]
            .startswith("cpkv: interrupted (SIGINT); finish with")
        )
        assert F.summary_matches_disk(sweep) == []
    assert F.temp_files(tmp_path) == []
    before = {p.name: F.meta(p)["start_utc"] for p in F.point_dirs(sweep) if F.complete(p)}
    resumed = F.run(["sweep", "--resume", str(sweep)], tmp_path)
    assert resumed.code == 0, resumed.stderr
    assert {p.name: F.rows_without_timing(p) for p in F.point_dirs(sweep)} == reference
    for name, started in before.items():
        assert F.meta(sweep / name)["start_utc"] == started  # not run twice


def test_a_capacity_search_runs_its_rounds_on_one_ray_session(cluster: str, tmp_path: Path) -> None:
    """cpkv capacity --executor ray: every round runs on the cluster joined once; the points
    and the capacities are those of a serial search."""
    from tests.helpers import closed_form as cf

    config = cf.write_config(tmp_path / "case")
    args = ["capacity", str(config), "admit.cost.fixed_us=20000,10000", "--tolerance", "0.05"]
    serial = F.run([*args, "-o", "serial"], tmp_path)
    ray = F.run([*args, "--executor", "ray", "--ray-address", cluster, "-o", "ray"], tmp_path,
                timeout=120)  # fmt: skip
    assert serial.code == 0 and ray.code == 0, ray.stderr
    table = [line for line in serial.stdout.splitlines() if "/" not in line]
    assert [line for line in ray.stdout.splitlines() if "/" not in line] == table


def test_an_open_port_that_is_not_ray_is_one_line_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as server:  # accepts connections and never says a word
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        (tmp_path / "h.yaml").write_text("kind: admit\nname: nowhere\n")
        out = F.run(["sweep", "h.yaml", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                     "-o", "out"], tmp_path, timeout=30)  # fmt: skip
    assert out.code == 2 and out.seconds < 15, (out.code, out.seconds, out.stderr)
    assert F.one_line(out.stderr) == (
        f"cpkv: error: --ray-address 127.0.0.1:{port}: not a Ray cluster there "
        "(no gRPC answer within 3s)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.yaml"]
