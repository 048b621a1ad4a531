"""Running sweeps: the sweep directory contract, failures, resume, dry runs, executors."""

from __future__ import annotations

import json
import signal
import socket
import types
from pathlib import Path

import pytest
import yaml

from cpkv.core.errors import ConfigError, UnsupportedError
from cpkv.sweep import EXECUTORS, executors, run_sweep
from cpkv.sweep.executors import check_ray_address
from tests.helpers.sweep_fake_kind import fake_kind  # noqa: F401  (fixture)

HOST = {
    "kind": "alloc_host",
    "name": "host-tiny",
    "alloc_host": {"host_sizes_gb": [], "host_pages": [600], "request_pages": [8], "patterns": ["random_fragmented"],
                   "repeat": 3, "warmup": 1},
}  # fmt: skip
ECHO = {"kind": "sweeptest", "name": "echo", "sweeptest": {"ticks": 2}}


def write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def only_sweep(root: Path) -> Path:
    (sweep,) = [p.parent for p in root.rglob("sweep.yaml")]
    return sweep


def summary(sweep: Path) -> dict:
    return json.loads((sweep / "summary.json").read_text())


def test_cli_sweep_writes_the_sweep_directory(cli, tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", {**HOST, "sweep": {"alloc_host.protocol": ["cold", "warm"]}})
    res = cli("sweep", cfg, "alloc_host.request_pages=4,8")
    assert res.exit_code == 0, res.output
    sweep = only_sweep(cli.root)
    assert res.output.strip().splitlines()[-1] == str(sweep)
    assert sweep.name.endswith("_sweep-host-tiny") and not (sweep / "INCOMPLETE").exists()
    points = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in points] == [
        "000_host-tiny_protocol=cold_request_pages=4", "001_host-tiny_protocol=cold_request_pages=8",
        "002_host-tiny_protocol=warm_request_pages=4", "003_host-tiny_protocol=warm_request_pages=8",
    ]  # fmt: skip
    for point in points:  # each point is an ordinary, complete run directory
        for name in ("config.yaml", "overrides.yaml", "meta.json", "results.json", "results.txt"):
            assert (point / name).is_file(), (point, name)
        cfg_doc = yaml.safe_load((point / "config.yaml").read_text())
        assert cfg_doc["alloc_host"]["request_pages"] == [int(point.name.rsplit("=", 1)[1])]
    doc = summary(sweep)
    assert doc["status"] == "complete" and doc["counts"] == {
        "points": 4,
        "complete": 4,
        "skipped": 0,
        "failed": 0,
        "incomplete": 0,
    }
    assert [p["swept"] for p in doc["points"]][1] == {
        "alloc_host.protocol": "cold",
        "alloc_host.request_pages": [8],
    }
    assert all(p["headline"]["gmean_p50_us"] > 0 for p in doc["points"])
    text = (sweep / "summary.txt").read_text()
    assert text in res.output
    # one table per kind, titled with the kind and its configs; the counts line last
    assert text.splitlines()[0] == "alloc_host: host-tiny"
    header = text.splitlines()[1].split()
    assert header[:5] == ["point", "config", "protocol", "request_pages", "gmean_p50_us"]
    assert text.splitlines()[-1] == "sweep host-tiny: 4 points: 4 complete"
    assert yaml.safe_load((sweep / "sweep.yaml").read_text())["points"][3]["overrides"] == [
        "alloc_host.protocol=warm", "alloc_host.request_pages=[8]"
    ]  # fmt: skip


def test_dry_run_lists_points_and_writes_nothing(cli, tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    res = cli(
        "sweep", cfg, "alloc_host.repeat=range(2,5)", "alloc_host.protocol=cold,warm", "--dry-run"
    )
    assert res.exit_code == 0, res.output
    assert (
        "6 points: 6 to run (6 ok, 0 would be skipped, 0 would fail), 0 done, 6 timed "
        "(dry run: nothing ran)" in res.output
    )
    assert "005_host-tiny_repeat=4_protocol=warm" in res.output
    res = cli("sweep", cfg, "alloc_host.repeat=2,3", "alloc_host.protocol=cold,warm", "--zip",
              "alloc_host.repeat,alloc_host.protocol", "--dry-run")  # fmt: skip
    assert (
        "2 points: 2 to run" in res.output and "001_host-tiny_repeat=3_protocol=warm" in res.output
    )
    assert not cli.root.exists()


def test_bad_input_exits_2_before_anything_is_written(cli, tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    for args in (
        [cfg, "alloc_host.page_size=16,0"],
        [cfg, "--executor", "slurm"],
        ["--resume", str(tmp_path), cfg],
        [],
    ):
        res = cli("sweep", *args)
        assert res.exit_code == 2, (args, res.output)
        assert res.output.startswith("cpkv: error: ") and len(res.output.strip().splitlines()) == 1
    assert not cli.root.exists()


def one_error_line(res) -> str:
    """The single ``cpkv: error:`` line of a run that exited 2."""
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


def test_a_bad_file_grid_value_names_the_file_line_and_point(cli, tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kind: admit\nname: s\nsweep:\n  admit.available_tokens: [100, -5]\n")
    line = one_error_line(cli("sweep", str(cfg)))
    assert line == (
        f"cpkv: error: {cfg}:4: sweep admit.available_tokens=-5: "
        "admit.available_tokens: must be >= 0, got -5"
    )
    cfg.write_text(
        "kind: admit\nname: s\nsweep:\n  zip:\n    admit.available_tokens: [1, 2]\n    seed: [1]\n"
    )
    line = one_error_line(cli("sweep", str(cfg)))
    assert line.startswith(f"cpkv: error: {cfg}:4: sweep.zip: lists moving in lock-step")
    cfg.write_text("kind: admit\nname: s\nsweep:\n  seed: 5\n")
    line = one_error_line(cli("sweep", str(cfg)))
    assert line.startswith(f"cpkv: error: {cfg}:4: sweep.seed: expected a non-empty list")
    assert not cli.root.exists()


def test_ray_address_needs_the_ray_executor(cli, tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    for extra in ([], ["--executor", "process"], ["--dry-run"]):
        res = cli("sweep", cfg, "--ray-address", "127.0.0.1:6379", *extra)
        assert one_error_line(res) == "cpkv: error: --ray-address needs --executor ray", extra
    assert not cli.root.exists()
    with pytest.raises(ConfigError, match="--ray-address needs --executor ray"):
        run_sweep([cfg], root=cli.root, executor="serial", address="127.0.0.1:6379")
    assert not cli.root.exists()


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def no_ray_start(monkeypatch):
    """Ray counts as installed, but its executor must never start (nor ray be imported)."""

    def must_not_run(phases, address, on_result) -> None:
        raise AssertionError(f"the ray executor started for {address}")

    monkeypatch.setattr(executors, "_ray_installed", lambda: True, raising=False)
    monkeypatch.setitem(EXECUTORS._entries, "ray", must_not_run)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_an_unreachable_ray_address_is_one_line_before_anything_is_written(
    cli, tmp_path: Path, no_ray_start
) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    port = closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        line = one_error_line(cli("sweep", cfg, "--executor", "ray", "--ray-address", address))
        assert line == (
            f"cpkv: error: --ray-address {address}: cannot reach a Ray cluster there "
            "(connection refused)"
        )
    line = one_error_line(cli("sweep", cfg, "--executor", "ray", "--ray-address", "head-node"))
    assert "--ray-address head-node: expected HOST:PORT or ray://HOST:PORT" in line
    assert not cli.root.exists()
    # resuming checks it too, and leaves the sweep as it was
    sweep = run_sweep([cfg], root=cli.root).path
    before = sorted(p.name for p in sweep.iterdir())
    res = cli("sweep", "--resume", str(sweep), "--executor", "ray", "--ray-address",
              f"127.0.0.1:{port}", output=False)  # fmt: skip
    assert "cannot reach a Ray cluster there" in one_error_line(res)
    assert sorted(p.name for p in sweep.iterdir()) == before


def listening(answer: bytes | None):
    """A local TCP server on a free port (returned) that answers every connection with
    ``answer`` after reading the client's first bytes (None: says nothing), until the test ends."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.recv(64)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


HTTP2_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # what a gRPC server (Ray's GCS) sends first


def test_ray_address_check(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    server, port = listening(HTTP2_SETTINGS)  # answers as a gRPC server does
    with server:
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", f"localhost:{port}"):
            check_ray_address(address)
    for answer, why in (
        (None, "no gRPC answer within 0.3s"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not as gRPC"),
    ):
        server, port = listening(answer)  # an open port where something else listens
        with (
            server,
            pytest.raises(
                UnsupportedError, match=rf"127.0.0.1:{port}: not a Ray cluster there \(.*{why}"
            ),
        ):
            check_ray_address(f"127.0.0.1:{port}", gcs_timeout=0.3)
    for address in (None, "auto", "local", "anyscale://my-cluster"):
        check_ray_address(address)  # left to ray.init: a local instance, or not ours to check
    port = closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # what ray.init(None or "auto") joins
    for address in (None, "auto"):
        with pytest.raises(UnsupportedError, match=rf"^RAY_ADDRESS=127.0.0.1:{port}: cannot reach"):
            check_ray_address(address)
    check_ray_address("local")

    def silent(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(UnsupportedError, match=r"10.0.0.9:6379: .* \(no answer within 3s\)$"):
        check_ray_address("10.0.0.9:6379")
    for bad in ("head-node", "ray://head-node", "10.0.0.9:port", "10.0.0.9:0", ":6379"):
        with pytest.raises(ConfigError, match="expected HOST:PORT or ray://HOST:PORT"):
            check_ray_address(bad)


def test_a_ray_that_cannot_start_is_one_line_and_no_sweep_directory(
    cli,
    tmp_path: Path,
    monkeypatch,
    fake_kind,  # noqa: F811
) -> None:
    cfg = write(tmp_path, "e.yaml", ECHO)  # not timed: no note before the error
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def init(**kwargs) -> None:
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify one.")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setattr(executors, "_ray_installed", lambda: True, raising=False)
    monkeypatch.setattr(executors, "_import_ray", lambda: fake)
    res = cli("sweep", cfg, "--executor", "ray", "--ray-address", "auto")
    assert one_error_line(res) == (
        "cpkv: error: --executor ray: cannot start Ray at auto: "
        "Could not find any running Ray instance."
    )
    assert not cli.root.exists()  # the sweep directory (and the folders made for it) are gone
    (cli.root / "keep").mkdir(parents=True)
    with pytest.raises(UnsupportedError, match="cannot start Ray"):
        run_sweep([cfg], root=cli.root, executor="ray")
    assert [p.name for p in cli.root.iterdir()] == ["keep"]


def test_a_failing_point_does_not_stop_the_others(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = write(tmp_path, "e.yaml", {**ECHO, "sweeptest": {"fail_on_scale": 2.0}})
    res = cli("sweep", cfg, "sweeptest.scale=1.0,2.0,3.0")
    assert res.exit_code == 1
    assert "1 of 3 points failed" in res.output
    doc = summary(only_sweep(cli.root))
    assert [p["status"] for p in doc["points"]] == ["complete", "failed", "complete"]
    assert "RuntimeError: planted failure at scale 2.0" in doc["points"][1]["error"]
    assert doc["status"] == "failed"
    assert "planted failure" in (only_sweep(cli.root) / "summary.txt").read_text()
    # a user error caught by prepare (no point directory) is a failed point too
    res = cli("sweep", cfg, "sweeptest.scale=-1.0,1.0")
    assert res.exit_code == 1
    sweep = max((p.parent for p in cli.root.rglob("sweep.yaml")), key=lambda p: p.name)
    doc = summary(sweep)
    assert doc["points"][0]["error"] == "sweeptest.scale: must be >= 0, got -1.0"
    assert not (sweep / doc["points"][0]["name"]).exists()


@pytest.mark.parametrize("wrote_meta", [False, True], ids=["before-meta", "after-meta"])
def test_a_signal_as_a_point_starts_leaves_no_hidden_or_running_point(
    cli,
    tmp_path: Path,
    fake_kind,  # noqa: F811
    monkeypatch,
    wrote_meta: bool,
) -> None:
    """A stop signal can land between a point's ``mkdir`` and its ``meta.json``, or between
    ``meta.json`` (``running``) and the runner's handler: the stopped sweep removes the first
    (``ls`` and ``--resume`` could not see it) and marks the second incomplete."""
    from cpkv.core import signals
    from cpkv.runs.rundir import RunDir

    cfg = write(tmp_path, "e.yaml", ECHO)
    created = RunDir.__dict__["create_at"].__func__

    def stopped_as_it_starts(cls, path: Path, meta: dict) -> RunDir:
        if wrote_meta:
            created(cls, path, meta)
        else:
            path.mkdir()
        raise signals.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(RunDir, "create_at", classmethod(stopped_as_it_starts))
    with pytest.raises(KeyboardInterrupt):
        run_sweep([cfg], ["sweeptest.scale=1,2"], root=cli.root)
    sweep = only_sweep(cli.root)
    point = sweep / summary(sweep)["points"][0]["name"]
    if wrote_meta:
        meta = json.loads((point / "meta.json").read_text())
        assert (meta["status"], meta["error"]) == ("incomplete", "interrupted (SIGTERM)")
        assert meta["end_utc"] is not None
    else:
        assert not point.exists()
    monkeypatch.undo()
    res = cli("sweep", "--resume", str(sweep), output=False)
    assert res.exit_code == 0, res.output
    assert [p["status"] for p in summary(sweep)["points"]] == ["complete", "complete"]


def test_resume_after_an_interrupted_sweep(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = write(tmp_path, "e.yaml", ECHO)
    seen = []

    def interrupt_after_two(result) -> None:
        seen.append(result.name)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep([cfg], ["sweeptest.scale=1,2,3,4"], root=cli.root, on_result=interrupt_after_two)
    sweep = only_sweep(cli.root)
    assert (sweep / "INCOMPLETE").exists()
    doc = summary(sweep)
    assert [p["status"] for p in doc["points"]] == [
        "complete",
        "complete",
        "incomplete",
        "incomplete",
    ]
    first_meta = (sweep / doc["points"][0]["name"] / "meta.json").read_text()
    # a point left half-done by the interruption is run again
    stale = sweep / doc["points"][2]["name"]
    stale.mkdir()
    (stale / "INCOMPLETE").write_text("x")
    res = cli("sweep", "--resume", str(sweep), output=False)
    assert res.exit_code == 0, res.output
    assert "resuming: 2 point(s) already complete, 2 to run" in res.output
    doc = summary(sweep)
    assert doc["status"] == "complete" and not (sweep / "INCOMPLETE").exists()
    assert (
        sweep / doc["points"][0]["name"] / "meta.json"
    ).read_text() == first_meta  # not run again
    rows = json.loads((sweep / doc["points"][3]["name"] / "results.json").read_text())["rows"]
    assert [r["tokens"] for r in rows] == [40.0, 80.0]  # scale 4: 10 * 4 * (tick + 1)
    # resuming a complete sweep runs nothing
    res = cli("sweep", "--resume", str(sweep), "--dry-run", output=False)
    assert "4 points: 0 to run" in res.output


def test_resume_refuses_what_it_cannot_read(cli, tmp_path: Path, fake_kind) -> None:  # noqa: F811
    cfg = write(tmp_path, "e.yaml", ECHO)
    sweep = run_sweep([cfg], root=cli.root).path
    res = cli("sweep", "--resume", str(tmp_path), output=False)
    assert res.exit_code == 2 and "not a cpkv sweep directory" in res.output
    plan = yaml.safe_load((sweep / "sweep.yaml").read_text())
    (sweep / "sweep.yaml").write_text(yaml.safe_dump({**plan, "sweep_version": 99}))
    for args in (
        ["sweep", "--resume", str(sweep)],
        ["show", str(sweep)],
        ["diff", str(sweep), str(sweep)],
    ):
        res = cli(*args, output=False)
        assert (
            res.exit_code == 2 and "sweep_version 99 is not supported (supported: 1)" in res.output
        ), args


def test_local_processes_run_points_in_parallel(cli, tmp_path: Path) -> None:
    cfg = write(tmp_path, "h.yaml", HOST)
    res = cli(
        "sweep", cfg, "alloc_host.request_pages=4,8", "--jobs", "2", "--allow-parallel-timing"
    )
    assert res.exit_code == 0, res.output
    assert "timed point(s)" not in res.output
    doc = summary(only_sweep(cli.root))
    assert [p["status"] for p in doc["points"]] == ["complete", "complete"]
    assert (
        yaml.safe_load((only_sweep(cli.root) / "sweep.yaml").read_text())["executor"] == "process"
    )


def test_timed_points_run_one_at_a_time_by_default(tmp_path: Path, fake_kind) -> None:  # noqa: F811
    host, echo = write(tmp_path, "h.yaml", HOST), write(tmp_path, "e.yaml", ECHO)
    notes, calls = [], []
    EXECUTORS._entries["spy"] = lambda phases, address, on_result: calls.extend(
        (ph.jobs, [t.point.kind for t in ph.tasks]) for ph in phases
    )
    try:
        run_sweep([host, echo], ["seed=1,2"], root=tmp_path / "exp", executor="spy", jobs=4,
                  on_start=lambda path, total, skipped, n: notes.extend(n))  # fmt: skip
    finally:
        EXECUTORS._entries.pop("spy")
    assert calls == [(4, ["sweeptest", "sweeptest"]), (1, ["alloc_host", "alloc_host"])]
    assert "2 timed point(s) (alloc_host) run one at a time" in notes[0]


def test_executor_help_names_every_executor() -> None:
    from cpkv.cli.common import EXECUTOR_NAMES

    assert tuple(EXECUTORS.names()) == EXECUTOR_NAMES


@pytest.mark.ray
def test_ray_sweep_on_a_local_instance(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = write(tmp_path, "h.yaml", HOST)
    res = cli("sweep", cfg, "alloc_host.request_pages=4,8", "--executor", "ray", "--jobs", "2")
    assert res.exit_code == 0, res.output
    sweep = only_sweep(cli.root)
    doc = summary(sweep)
    assert [p["status"] for p in doc["points"]] == ["complete", "complete"]
    for p in doc["points"]:  # the driver wrote each point's files into the sweep directory
        point = sweep / p["name"]
        assert json.loads((point / "results.json").read_text())["kind"] == "alloc_host"
        assert not (point / "INCOMPLETE").exists()
        assert json.loads((point / "meta.json").read_text())["status"] == "complete"
