"""Where sweep points run: a registry of executors (serial, local processes, Ray).

An executor takes tasks and calls ``on_result`` once per task, in completion order, from
the calling thread. Every executor runs a point through :func:`run_point`, which calls
:func:`cpkv.runs.runner.run_experiment`, so a point directory is an ordinary run directory.
A failing point becomes a ``failed`` result; it never stops the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpkv.core import signals
from cpkv.core.errors import ConfigError, CpkvError, OutputError, UnsupportedError
from cpkv.core.files.writes import reason, write_atomic
from cpkv.core.registry import Registry
from cpkv.runs.rundir import MARKER, STATUS_COMPLETE, STATUS_FAILED
from cpkv.sweep.plan import Point
from cpkv.sweep.store import STATUS_SKIPPED, PointResult


@dataclass(frozen=True)
class Task:
    """A point to run into ``path`` (``argv`` goes to its meta.json). Everything that shapes
    the point's run travels with it: ``plots`` False draws none (``--no-plots``, or
    ``CPKV_PLOTS=0`` where the sweep was started), None lets the worker draw them when it has
    matplotlib."""

    point: Point
    path: Path
    argv: tuple[str, ...] = ()
    plots: bool | None = None


@dataclass(frozen=True)
class Phase:
    """Tasks to run with at most ``jobs`` at once (None: as many as the executor has cores)."""

    tasks: Sequence[Task]
    jobs: int | None = None


OnResult = Callable[[PointResult], None]
Executor = Callable[[Sequence[Phase], "str | None", OnResult], None]
"""``executor(phases, address, on_result)``: run the phases in order, each task once."""


def run_point(task: Task) -> PointResult:
    """Run one point into ``task.path``; errors become a failed result, and a point that
    cannot run on this machine (its prepare raises UnsupportedError) a skipped one."""
    from cpkv.runs.headline import headline
    from cpkv.runs.runner import run_experiment

    point = task.point
    start = time.perf_counter()
    try:
        result = run_experiment(
            point.loaded(),
            task.path.parent,
            argv=list(task.argv),
            run_dir=task.path,
            plots=task.plots,
        )
    except UnsupportedError as err:  # cannot run here (no CUDA, a package missing)
        status = STATUS_FAILED if task.path.exists() else STATUS_SKIPPED  # skipped: nothing ran
        return PointResult(point.index, point.name, status, str(err), time.perf_counter() - start)
    except CpkvError as err:
        return PointResult(
            point.index, point.name, STATUS_FAILED, str(err), time.perf_counter() - start
        )
    except Exception as err:  # noqa: BLE001 - a bug in one point must not stop the sweep
        where = traceback.extract_tb(err.__traceback__)[-1]
        error = f"{type(err).__name__}: {err} (at {Path(where.filename).name}:{where.lineno})"
        return PointResult(
            point.index, point.name, STATUS_FAILED, error, time.perf_counter() - start
        )
    return PointResult(point.index, point.name, STATUS_COMPLETE, None, time.perf_counter() - start,
                       headline(result.record))  # fmt: skip


EXECUTORS: Registry[Executor] = Registry("sweep executor")


@EXECUTORS.register("serial", help="one point after another, in this process")
def serial(phases: Sequence[Phase], address: str | None, on_result: OnResult) -> None:
    for phase in phases:
        for task in phase.tasks:
            on_result(run_point(task))


@EXECUTORS.register("process", help="local worker processes (--jobs N, default: all cores)")
def processes(phases: Sequence[Phase], address: str | None, on_result: OnResult) -> None:
    for phase in phases:
        if phase.tasks:
            _process_pool(phase, on_result)


_SESSION_POOLS: list[Any] = []
"""The worker pool of an open :func:`executor_session` of the process executor (at most one)."""


def _new_pool(jobs: int) -> Any:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=signals.worker_install,
    )


def _process_pool(phase: Phase, on_result: OnResult) -> None:
    """Run a phase's tasks on worker processes: the open session's pool (kept for the next
    call), else a pool of its own (shut down at the end)."""
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    shared = bool(_SESSION_POOLS)
    pool = (
        _SESSION_POOLS[0]
        if shared
        else _new_pool(min(phase.jobs or os.cpu_count() or 1, len(phase.tasks)))
    )
    try:
        futures = {pool.submit(run_point_in_worker, t): t for t in phase.tasks}
        for fut in as_completed(futures):
            try:
                result = fut.result()
            except BrokenProcessPool as err:
                point = futures[fut].point
                result = PointResult(
                    point.index, point.name, STATUS_FAILED, f"worker process died ({err})"
                )
            on_result(result)
    except BaseException:
        stop_workers(pool)
        if shared:
            _SESSION_POOLS.clear()  # its workers are gone: the session must not reuse it
        raise
    if not shared:
        pool.shutdown()


def run_point_in_worker(task: Task) -> PointResult:
    """:func:`run_point` in a pool's worker: SIGTERM from the driver marks the point incomplete
    (the runner does), then ends the worker."""
    try:
        with signals.busy():
            return run_point(task)
    except KeyboardInterrupt as err:
        os._exit(signals.exit_code(err))


STOP_WAIT_S = 10.0
"""How long a stopped sweep waits for its workers to mark their points and exit (then SIGKILL)."""


def stop_workers(pool: Any) -> None:
    """Stop a process pool now: SIGTERM to every worker (each marks its point incomplete and
    exits), no queued point starts, then wait for them, so that nothing writes into the sweep
    directory after its summary."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)


@EXECUTORS.register(
    "ray", help="tasks on a Ray cluster (--ray-address ADDR; a local instance without one)"
)
def ray_tasks(phases: Sequence[Phase], address: str | None, on_result: OnResult) -> None:
    """Points run as Ray tasks; each returns its run directory's files, written here by the driver.

    The driver writes the files, so the sweep directory is complete even when workers run
    on other machines (which need the same cpkv installed, and any input files the configs
    name at the same paths). Without ``address`` a local Ray instance is started (and stopped).
    """
    if not any(phase.tasks for phase in phases):
        return
    ray = _import_ray()
    started = not ray.is_initialized()
    with _no_ray_failure_handler():
        _ray_run(ray, started, phases, address, on_result)


NO_FAILURE_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


@contextlib.contextmanager
def _no_ray_failure_handler() -> Any:
    """Ray's C++ failure-signal handler (a stack dump, exit 1) can take SIGTERM/SIGHUP from
    cpkv's handlers after ``ray.init``, from a thread of Ray's; it is off while cpkv drives Ray
    (and in the Ray processes a local instance starts), unless the user set it."""
    saved = os.environ.get(NO_FAILURE_HANDLER)
    os.environ.setdefault(NO_FAILURE_HANDLER, "1")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(NO_FAILURE_HANDLER, None)


def _ray_init(ray: Any, address: str | None, jobs: int | None) -> None:
    """Start a local Ray instance or join ``address`` (UnsupportedError in one line)."""
    # no address: a fresh local instance ("local"), even when a cluster already runs on
    # this machine (ray.init() would join it), unless RAY_ADDRESS names one
    target = address or os.environ.get("RAY_ADDRESS", "").strip() or "local"
    kwargs = {"num_cpus": jobs} if target == "local" and jobs else {}
    handlers = signals.snapshot()
    try:
        ray.init(
            address=target,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="warning",
            **kwargs,
        )
    except Exception as err:  # noqa: BLE001 - any failure to start or join Ray is one line
        with contextlib.suppress(Exception):
            ray.shutdown()  # whatever ray.init got as far as starting
        where = f" at {address}" if address else ""
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise UnsupportedError(f"--executor ray: cannot start Ray{where}: {lines[0]}") from None
    finally:
        signals.restore(handlers)  # SIGTERM and SIGHUP stop the sweep as Ctrl-C does


@contextlib.contextmanager
def executor_session(name: str, address: str | None = None, jobs: int | None = None) -> Any:
    """Keep an executor set up across several calls (a capacity search runs its points in
    rounds): the process executor starts its ``jobs`` worker processes once (each call runs
    on them; they stop at the end, or at once on Ctrl-C); Ray starts, or joins ``address``,
    once, and stops at the end (each call finds it running and leaves it so); serial needs
    nothing."""
    name = EXECUTORS.canonical(name)
    if name == "process" and not _SESSION_POOLS:
        _SESSION_POOLS.append(_new_pool(jobs or os.cpu_count() or 1))
        try:
            yield
        finally:
            if _SESSION_POOLS:
                _SESSION_POOLS.pop().shutdown()
        return
    if name != "ray":
        yield
        return
    ray = _import_ray()
    if ray.is_initialized():
        yield
        return
    with _no_ray_failure_handler():
        _ray_init(ray, address, jobs)
        try:
            yield
        finally:
            ray.shutdown()


def _ray_run(
    ray: Any, started: bool, phases: Sequence[Phase], address: str | None, on_result: OnResult
) -> None:
    if started:
        _ray_init(ray, address, max((p.jobs for p in phases if p.tasks and p.jobs), default=None))
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point_packed)
        for phase in phases:
            limit = phase.jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
            tasks = [shippable(t) for t in phase.tasks]
            _ray_phase(ray, remote, tasks, limit, on_result)
    finally:
        if started:
            ray.shutdown()


def shippable(task: Task, cwd: Path | None = None) -> Task:
    """``task`` with its point's relative input paths (the kind's ``input_files``) made absolute
    against ``cwd`` (default: the driver's working directory): a worker runs in another one,
    so it reads the files the driver would (the point's config.yaml records the absolute path)."""
    from dataclasses import replace

    from cpkv.core.kinds import KINDS

    base = Path.cwd() if cwd is None else cwd
    config = _deep_copy(task.point.config)
    changed = False
    for key in KINDS.get(task.point.kind).input_files:
        *parents, leaf = key.split(".")
        holder = config
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        value = holder.get(leaf) if isinstance(holder, dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            holder[leaf] = str(base / value)  # type: ignore[index]
            changed = True
    return replace(task, point=replace(task.point, config=config)) if changed else task


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_deep_copy(v) for v in tree]
    return tree


def _ray_phase(ray: Any, remote: Any, queue: list[Task], limit: int, on_result: OnResult) -> None:
    pending: dict[Any, Task] = {}
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                task = queue.pop(0)
                pending[remote.remote(task)] = task
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_result(_unpack_result(ray, ref, pending.pop(ref)))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _unpack_result(ray: Any, ref: Any, task: Task) -> PointResult:
    try:
        result, files = ray.get(ref)
    except Exception as err:  # noqa: BLE001 - a lost worker fails one point
        return PointResult(
            task.point.index,
            task.point.name,
            STATUS_FAILED,
            f"ray task failed: {type(err).__name__}: {err}",
        )
    if files:
        write_files(task.path, files)
    return result


def run_point_packed(task: Task) -> tuple[PointResult, dict[str, bytes]]:
    """Run a point in a scratch directory and return its files (for remote workers)."""
    with tempfile.TemporaryDirectory(prefix="cpkv-point-") as tmp:
        scratch = Path(tmp) / task.point.name
        result = run_point(dataclasses.replace(task, path=scratch))
        files = {}
        if scratch.is_dir():
            files = {
                str(f.relative_to(scratch)): f.read_bytes()
                for f in sorted(scratch.rglob("*"))
                if f.is_file()
            }
    return result, files


def write_files(path: Path, files: dict[str, bytes]) -> None:
    """Write a packed run directory: meta.json first (so the point is visible at once),
    results.json last, each file atomically, the INCOMPLETE marker kept until the end."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name in files:
            (path / name).parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{path}: cannot create ({reason(err)})") from None
    write_atomic(path / MARKER, "being written by the sweep driver\n", fsync=False)
    order = sorted(files, key=lambda name: (name != "meta.json", name == "results.json", name))
    for name in order:
        write_atomic(path / name, files[name], fsync=False)
    if MARKER not in files:
        (path / MARKER).unlink(missing_ok=True)


def _import_ray():  # noqa: ANN202 - the ray module
    try:
        import ray
    except ImportError:
        raise UnsupportedError("--executor ray needs ray: pip install 'cpkv[ray]'") from None
    return ray


def check_executor(name: str, address: str | None = None) -> None:
    """Raise a user error now (before any directory exists) when ``name`` cannot run here:
    an unknown executor, ray not installed, ``address`` without ray or out of reach."""
    name = EXECUTORS.canonical(name)
    check_address_option(name, address)
    if name == "ray":
        if not _ray_installed():
            raise UnsupportedError("--executor ray needs ray: pip install 'cpkv[ray]'")
        check_ray_address(address)


def check_address_option(executor: str | None, address: str | None) -> None:
    """ConfigError for a cluster address given to an executor other than ray."""
    if address is not None and (executor is None or EXECUTORS.canonical(executor) != "ray"):
        raise ConfigError("--ray-address needs --executor ray")


def _ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


REACH_TIMEOUT_S = 3.0
"""How long :func:`check_ray_address` waits for a TCP connection to the cluster."""
GCS_TIMEOUT_S = 3.0
"""How long :func:`check_ray_address` waits for the cluster to answer as a Ray cluster."""


def check_ray_address(
    address: str | None, timeout: float = REACH_TIMEOUT_S, gcs_timeout: float = GCS_TIMEOUT_S
) -> None:
    """A user error unless the cluster ``ray.init(address)`` would join answers as Ray.

    Cheap (no ray import): ``HOST:PORT`` (the GCS) and ``ray://HOST:PORT`` (Ray Client) are
    tried, a TCP connection first (``timeout``), then whether it answers as gRPC
    (``gcs_timeout``, see :func:`_not_ray`); ``None`` and ``auto`` try ``RAY_ADDRESS`` when it is set (as
    ``ray.init`` does) and are otherwise left to Ray (a local instance); ``local`` and other
    schemes are not checked. Without the check ``ray.init`` retries an unreachable address,
    or one where something else listens, for minutes.
    """
    label = f"--ray-address {address}"
    if address in (None, "auto"):
        env = os.environ.get("RAY_ADDRESS", "").strip()
        if not env:
            return
        address, label = env, f"RAY_ADDRESS={env}"
    if address in ("auto", "local"):
        return
    host, port = _host_port(address, label)
    if host is None:
        return
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise UnsupportedError(
            f"{label}: cannot reach a Ray cluster there ({_why(err, host, timeout)})"
        ) from None
    problem = _not_ray(host, port, gcs_timeout)
    if problem:
        raise UnsupportedError(f"{label}: not a Ray cluster there ({problem})")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, stream 0
_SETTINGS_FRAME = 4


def _not_ray(host: str, port: int, timeout: float) -> str | None:
    """Why ``host:port`` cannot be a Ray cluster, within ``timeout`` seconds; None when it
    answers as a gRPC server does (the GCS and the Ray Client server are gRPC servers).

    An open port that is not Ray makes ``ray.init`` retry for minutes, deaf to Ctrl-C. A gRPC
    (HTTP/2) server answers the HTTP/2 connection preface with its SETTINGS frame at once;
    anything else stays silent, closes, or answers in another protocol. (No grpc import: Ray
    does not bring grpcio.)
    """
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(_HTTP2_PREFACE + _EMPTY_SETTINGS)
            head = b""
            while len(head) < 9:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    return "it closed the connection without answering as gRPC"
                head += chunk
    except TimeoutError:
        return f"no gRPC answer within {timeout:g}s"
    except OSError as err:
        return _why(err, host, timeout)
    stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    if head[3] != _SETTINGS_FRAME or stream != 0:
        return f"it answered {head[:9]!r}, not as gRPC"
    return None


def _host_port(address: str, label: str) -> tuple[str | None, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; ``(None, 0)`` for other schemes."""
    scheme, sep, rest = address.strip().partition("://")
    if not sep:
        rest = scheme
    elif scheme.lower() != "ray":
        return None, 0  # a Ray Client module of its own (ray.init imports it): not ours to check
    host, colon, port = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{label}: expected HOST:PORT or ray://HOST:PORT (or auto, local)")
    return host, int(port)


def _why(err: OSError, host: str, timeout: float) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(err, socket.gaierror):
        return f"unknown host {host}: {err.strerror or err}"
    text = err.strerror or str(err) or type(err).__name__
    return text[:1].lower() + text[1:]
