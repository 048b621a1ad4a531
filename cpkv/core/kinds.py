"""The experiment kinds: the value of ``kind:`` in a config, and what runs it.

Every kind names its top-level config dataclass and a *prepare* function, both as lazy
``"module:attribute"`` references so that nothing heavy is imported until a kind runs.

A kind also names the function that draws a finished run's plots (``plot``), so that the
runner reaches the plotting layer through this registry, never by importing it, and may name
a ``diff_view``: ``(record, run_dir) -> record or None``, the rows ``cpkv diff`` should match
instead of the run's own (the admit kind's ticks become one row per request).

``prepare(config) -> execute`` checks everything a user can get wrong (input files,
devices, optional packages) and raises :class:`cpkv.core.errors.CpkvError` before any run
directory exists; ``execute(ctx) -> RunOutput`` does the work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpkv.core.files.writes import StreamedFile
from cpkv.core.registry import Registry, _import_ref

if TYPE_CHECKING:
    from cpkv.runs.results import RunOutput


@dataclass(frozen=True)
class RunContext:
    """What a running experiment may use: its directory, a progress hook, and files it
    writes as it goes (:meth:`stream`)."""

    run_dir: Path | None = None
    progress: Callable[[int, int, str], None] | None = None
    streams: dict[str, StreamedFile] = field(default_factory=dict, compare=False, repr=False)

    def report(self, done: int, total: int, label: str = "") -> None:
        if self.progress is not None:
            self.progress(done, total, label)

    def stream(self, name: str) -> StreamedFile:
        """An extra file of the run (``requests.jsonl``) written piece by piece while the
        run goes: the runner renames it into place with the results, or removes it when the
        run fails. Without a run directory it is kept in memory: the kind puts its
        :meth:`~cpkv.core.files.writes.StreamedFile.text` in its extras instead."""
        file = StreamedFile(None if self.run_dir is None else self.run_dir / name)
        self.streams[name] = file
        return file


Execute = Callable[[RunContext], "RunOutput"]


@dataclass(frozen=True)
class KindSpec:
    name: str
    command: str
    config: str
    prepare: str
    summary: str
    block: str
    timed: bool = False  # rows hold wall-clock timings: sweeps run such points one at a time
    plot: str = "cpkv.plots.records:plot_run"  # draws a finished run's plots/ (matplotlib)
    memory: str | None = None  # estimate(config) -> MemoryNeed | None (cpkv.core.memory)
    input_files: tuple[str, ...] = ()  # dotted keys naming input files (resolved for Ray workers)
    diff_view: str | None = None  # the rows cpkv diff matches instead of the run's (see above)
    # (config) -> µs of the run's last arrival (a load search keeps it in the clock's range)
    last_arrival: str | None = None

    def config_cls(self) -> type:
        return _import_ref(self.config)

    def prepare_fn(self) -> Callable[[Any], Execute]:
        return _import_ref(self.prepare)

    def plot_fn(self) -> Callable[..., None]:
        return _import_ref(self.plot)

    def check_memory(self, config: Any) -> None:
        """UnsupportedError when the run of ``config`` cannot fit in this machine's memory."""
        if self.memory is not None:
            from cpkv.core.memory import check_fits

            check_fits(_import_ref(self.memory)(config))

    def diff_view_fn(self) -> Callable[..., Any] | None:
        return _import_ref(self.diff_view) if self.diff_view else None

    def last_arrival_fn(self) -> Callable[[Any], float] | None:
        return _import_ref(self.last_arrival) if self.last_arrival else None


KINDS: Registry[KindSpec] = Registry("config kind")


def register_kind(spec: KindSpec) -> None:
    KINDS.register(spec.name, spec, help=spec.summary)


register_kind(
    KindSpec(
        name="alloc_host",
        command="cpkv alloc host",
        config="cpkv.alloc.host.schema:AllocHostConfig",
        prepare="cpkv.alloc.host.bench:prepare",
        summary="host (L2 / HiCache) KV allocator benchmark",
        block="alloc_host",
        timed=True,
        memory="cpkv.alloc.host.schema:memory_need",
    )
)
register_kind(
    KindSpec(
        name="trace_stats",
        command="cpkv trace stats",
        config="cpkv.trace.schema:TraceStatsConfig",
        prepare="cpkv.trace.run:prepare_stats",
        summary="request trace statistics and L1/L2 prefix-cache ratios",
        block="trace",
        memory="cpkv.trace.schema:memory_need",
        input_files=("trace.path",),
    )
)
register_kind(
    KindSpec(
        name="trace_curve",
        command="cpkv trace curve",
        config="cpkv.trace.schema:TraceCurveConfig",
        prepare="cpkv.trace.run:prepare_curve",
        summary="prefix-cache hit ratio against capacity for a request trace",
        block="trace",
        memory="cpkv.trace.schema:memory_need",
        input_files=("trace.path",),
    )
)
register_kind(
    KindSpec(
        name="alloc_l1",
        command="cpkv alloc l1",
        config="cpkv.alloc.l1.schema:AllocL1Config",
        prepare="cpkv.alloc.l1.bench:prepare",
        summary="CP shared paged L1 allocator benchmark",
        block="alloc_l1",
        timed=True,
        memory="cpkv.alloc.l1.schema:memory_need",
    )
)
register_kind(
    KindSpec(
        name="admit",
        command="cpkv admit",
        config="cpkv.admit.schema:AdmitConfig",
        prepare="cpkv.admit.run:prepare",
        summary="prefill admission, tick by tick: SGLang's PrefillAdder with HiCache load-back and CP limits",
        block="admit",
        memory="cpkv.admit.schema:memory_need",
        input_files=("admit.workload.path", "admit.cost.fit_points"),
        diff_view="cpkv.admission.per_request:request_view",
        last_arrival="cpkv.admit.arrival_span:last_arrival_us",
    )
)
