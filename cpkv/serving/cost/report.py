"""Where a serving run's time went: per timeline bucket and summed (``timeline.jsonl``, summary).

Each iteration's :meth:`~cpkv.serving.cost.base.IterationCost.breakdown` (time, the parts,
model FLOPs: 8 doubles, :data:`FIELDS`) is computed while the run goes on, a batch of
iterations at a time, from their cost arguments (:func:`breakdown_columns`: column by column,
a column equal in every iteration of the batch as one float); :class:`TimeTotals` sums them
over the run, in iteration order (the summary's ``time`` needs nothing else), and the
columns are spilled with the samples for the per-bucket sums, which wait for the makespan
(:mod:`cpkv.serving.record.timeline`).

Per bucket of the timeline (``admit.serving.timeline_points`` equal spans of [0, makespan];
an iteration that spans a bucket edge is split by time, each part in proportion):
``<part>_ms`` (time in each
of :data:`~cpkv.serving.cost.base.PARTS`), ``busy_pct`` (iteration time / bucket span) and
``mfu_pct`` (model FLOPs / (bucket span x peak FLOP/s of all GPUs); null without FLOPs)
(:func:`breakdown_row`). Summed (the summary's ``time``, :func:`summed_time`): ``busy_s``,
``busy_pct`` (of the makespan), ``<part>_s`` and ``<part>_pct`` (of the busy time),
``model_tflop``, ``mfu_pct`` (over the makespan) and ``mfu_busy_pct`` (over the busy time).
"""

from __future__ import annotations

from typing import Any

from cpkv.core.schema import to_dict
from cpkv.serving.cost.base import PARTS
from cpkv.serving.cost.roofline import mfu_pct

FIELDS = 8  # time, the six parts, FLOPs


class TimeTotals:
    """The breakdown summed over every iteration of a run: fed the columns of each batch
    (:func:`breakdown_columns`) as the run goes, each column's batch summed by numpy
    (pairwise) and the batches' sums added in order."""

    def __init__(self) -> None:
        import numpy as np

        self.sums = np.zeros(FIELDS)

    def add(self, columns: list[Any], n: int) -> None:
        """The next ``n`` iterations' columns (arrays, or one float for all ``n``)."""
        sums = self.sums
        for j, column in enumerate(columns):
            if isinstance(column, float):
                sums[j] += column * n
            elif n:
                sums[j] += column.sum()


def breakdown_columns(model: Any, *arguments: Any) -> list[Any]:
    """The breakdowns of ``n`` iterations given as six integer arrays (the arguments of
    ``batch_us``), as :data:`FIELDS` columns, each a float64 array of ``n`` this caller may
    overwrite or a float (the same in every iteration): the model's own vectorised
    ``breakdowns`` when its class has one, else its ``breakdown`` iteration by iteration."""
    import numpy as np

    many = getattr(type(model), "breakdowns", None)  # (not a wrapped model's, by __getattr__)
    if many is not None:
        columns = many(model, *arguments)
    else:
        rows = [model.breakdown(*(int(v) for v in args)) for args in zip(*arguments, strict=True)]
        table = np.array(rows, dtype=float).reshape(-1, FIELDS)
        columns = [table[:, j] for j in range(FIELDS)]
    out: list[Any] = []
    seen: set[int] = set()
    for column in columns:
        if np.ndim(column) == 0:  # a float (or any number) for every iteration
            out.append(float(column))
            continue
        if id(column) in seen or not column.flags.c_contiguous or not column.flags.writeable:
            column = np.array(column, dtype=float)  # one array per column, contiguous, ours
        elif column.dtype != np.float64:
            column = column.astype(float)
        seen.add(id(column))
        out.append(column)
    return out


def breakdown_row(sums: Any, width: float, peak: float | None) -> dict[str, float | None]:
    """One timeline bucket's time in each part (ms), busy and MFU percentages (module
    docstring), from its 8 sums."""
    row: dict[str, float | None] = {
        f"{p}_ms": round(float(sums[1 + j]) / 1000.0, 4) for j, p in enumerate(PARTS)
    }
    row["busy_pct"] = round(100.0 * float(sums[0]) / width, 4)
    mfu = mfu_pct(float(sums[7]), width / 1e6, peak)
    row["mfu_pct"] = None if mfu is None else round(mfu, 4)
    return row


def summed_time(totals: Any, end_us: float, peak: float | None) -> dict[str, float | None]:
    busy_us = float(totals[0])
    out: dict[str, float | None] = {
        "busy_s": round(busy_us / 1e6, 6),
        "busy_pct": round(100.0 * busy_us / end_us, 4) if end_us > 0 else None,
    }
    for j, part in enumerate(PARTS):
        out[f"{part}_s"] = round(float(totals[1 + j]) / 1e6, 6)
    for j, part in enumerate(PARTS):
        out[f"{part}_pct"] = (
            round(100.0 * float(totals[1 + j]) / busy_us, 4) if busy_us > 0 else None
        )
    flops = float(totals[7])
    out["model_tflop"] = round(flops / 1e12, 6) if peak is not None else None
    for key, seconds in (("mfu_pct", end_us / 1e6), ("mfu_busy_pct", busy_us / 1e6)):
        mfu = mfu_pct(flops, seconds, peak)
        out[key] = None if mfu is None else round(mfu, 4)
    return out


def time_note(time: dict[str, Any]) -> str:
    """One line of the summed time, for the run's notes."""
    busy = time["busy_pct"]
    parts = ", ".join(f"{p} {time[f'{p}_pct']:.1f}%" for p in PARTS if time[f"{p}_pct"] is not None)
    line = f"time breakdown: GPU busy {'-' if busy is None else f'{busy:.1f}%'} of the makespan"
    if parts:
        line += f"; of the busy time {parts}"
    if time["mfu_pct"] is None:
        return line + "; MFU: - (this cost model counts no FLOPs)"
    busy_mfu = time["mfu_busy_pct"]
    shown = "-" if busy_mfu is None else f"{busy_mfu:.2f}%"
    return line + f"; MFU {time['mfu_pct']:.2f}% ({shown} of the busy time)"


def cost_note(model: Any) -> str:
    """One line naming a roofline model's deployment and calibration, for the run's notes."""
    name, gpu = model.names
    cal = model.calibration
    shown = ", ".join(f"{k}={v:g}" for k, v in to_dict(cal).items())
    cpu = model.cpu
    gpus, stages = model.tp * model.pp, f", PP {model.pp}" if model.pp > 1 else ""
    experts = f", EP {model.ep}" if model.ep > 1 else ""
    return (
        f"cost model roofline: {name or 'an inline model shape'} on {gpus} x {gpu} "
        f"(TP {model.tp}{stages}{experts}), KV {model.kv_bytes_per_token} bytes/token; linear "
        "layers, elementwise kernels and all-reduce calibrated on measured GPU profiles; "
        "attention and load-back modelled; the engine's CPU work "
        f"{cpu.iteration_us:g} us + {cpu.request_us:g} us a sequence + {cpu.token_us:g} us a "
        f"token, {'overlapped' if cpu.overlap else 'not overlapped'}; all-reduce "
        f"{model.allreduce}; calibration: {shown}{_cp_note(model)}"
    )


def _cp_note(model: Any) -> str:
    """The CP prefill's part of :func:`cost_note` ('' without CP)."""
    work = getattr(model, "cp_work", None)
    if work is None:
        return ""
    return (
        f"; CP prefill on {work.size} ranks ({work.size * model.tp} GPUs), KV {work.exchange}, "
        f"the cached prefix gathered from {work.page_size}-token pages owned round-robin, "
        f"descriptors {work.descriptor_page_us:g} us a page + {work.descriptor_fixed_us:g} us, "
        f"load-back {work.load_back_page_us:g} us a page"
    )
