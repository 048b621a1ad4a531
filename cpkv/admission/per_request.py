"""An admission run seen per request, for ``cpkv diff``: which tick admitted each request.

Two runs of one workload under different budgets batch the queue differently: once one tick
differs, tick ``k`` of A and tick ``k`` of B hold different requests, and comparing them row
by row compares unrelated batches. Per request, the question has one answer per row: when was
request ``r`` admitted, with what prefix, computing how many tokens, in how many chunks.
The rows come from ``ticks.jsonl`` (every accepted request of every tick), or, for a run
without it, from the ``accepted`` column of the tick table (then only the ticks and the chunk
count are known).
Requests that no tick admitted have no row (the summary's ``requests_waiting`` counts them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cpkv.core.schema import to_dict
from cpkv.runs.results import Columns, RunRecord, metric

_ACCEPTED = re.compile(r"^(?P<rid>.*?)(?: \((?:cut|cont) \d+\))?$")


@dataclass(frozen=True)
class RequestAdmission:
    """One admitted request: the tick that admitted it and the tick its last chunk ran in,
    its prefix at admission (L1 plus L2 loaded back), the tokens it computed over all its
    chunks, and the L2 tokens loaded back for it."""

    rid: str
    tick: int = metric(unit="tick")
    done_tick: int = metric(unit="tick")
    chunks: int = metric(unit="passes")
    prefix_tokens: int | None = metric(unit="tokens", lower_is_better=False)
    extend_tokens: int | None = metric(unit="tokens")
    loaded_tokens: int | None = metric(unit="tokens", lower_is_better=False)


TABLE_COLUMNS = ("rid", "tick", "done_tick", "chunks", "prefix_tokens", "extend_tokens")


def request_view(record: RunRecord, run_dir: Path) -> RunRecord | None:
    """``record`` as one row per admitted request; None when its rows are not admission ticks."""
    if not record.rows or "accepted" not in record.rows[0] or "tick" not in record.rows[0]:
        return None
    ticks_file = run_dir / "ticks.jsonl"
    rows = _from_ticks_file(ticks_file) if ticks_file.is_file() else _from_table(record.rows)
    source = "ticks.jsonl" if ticks_file.is_file() else "the tick table (no ticks.jsonl)"
    return RunRecord(
        kind=record.kind,
        name=record.name,
        columns=Columns.of(RequestAdmission),
        rows=[to_dict(r) for r in rows],
        summary=record.summary,
        table_columns=list(TABLE_COLUMNS),
        notes=[f"one per admitted request, from {source}"],
        schema_version=record.schema_version,
        summary_directions=record.summary_directions,
    )


def _from_ticks_file(path: Path) -> list[RequestAdmission]:
    seen: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            tick = json.loads(line)
            for acc in tick.get("accepted") or ():
                _add(seen, str(acc["rid"]), int(tick["tick"]), int(acc["extend_tokens"]),
                     acc.get("prefix_tokens"), acc.get("loaded_tokens"))  # fmt: skip
    return [RequestAdmission(rid, **fields) for rid, fields in seen.items()]


def _from_table(rows: list[dict[str, Any]]) -> list[RequestAdmission]:
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        for item in filter(None, (s.strip() for s in str(row.get("accepted") or "").split(","))):
            m = _ACCEPTED.match(item)
            assert m is not None  # the pattern matches any string
            _add(seen, m.group("rid"), int(row["tick"]), None, None, None)
    return [RequestAdmission(rid, **fields) for rid, fields in seen.items()]


def _add(
    seen: dict[str, dict[str, Any]], rid: str, tick: int, extend: int | None, prefix: Any,
    loaded: Any,
) -> None:  # fmt: skip
    """The first tick a request appears in admits it; later ticks run its continuing chunks."""
    entry = seen.get(rid)
    if entry is None:
        seen[rid] = {"tick": tick, "done_tick": tick, "chunks": 1, "prefix_tokens": prefix,
                     "extend_tokens": extend, "loaded_tokens": loaded}  # fmt: skip
        return
    entry["done_tick"] = tick
    entry["chunks"] += 1
    if extend is not None and entry["extend_tokens"] is not None:
        entry["extend_tokens"] += extend
