"""Write a workload as a requests file of the ``jsonl`` source (``cpkv admit --write-workload``).

Any source can be written: a synthetic workload becomes a file that the ``jsonl`` source
reads back as the same requests (the same rids, token counts, ``max_new_tokens``,
``priority`` and ``arrival_ms``), so a benchmark can time JSONL parsing and admission on a
file nobody has to commit. Optional fields that hold their default (0 hits, no
``max_new_tokens``, priority 0, arrival 0) are left out of a line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from cpkv.core.errors import InputError, OutputError
from cpkv.core.files.writes import reason, write_atomic
from cpkv.workload.request import Request
from cpkv.workload.sources import WorkloadSpec, load_workload


def request_json(r: Request) -> str:
    """One request as a line of the ``jsonl`` source (without the newline)."""
    obj: dict[str, object] = {"rid": r.rid}
    if r.l1_cached_tokens:
        obj["l1_cached_tokens"] = r.l1_cached_tokens
    if r.l2_cached_tokens:
        obj["l2_cached_tokens"] = r.l2_cached_tokens
    obj["extend_tokens"] = r.extend_tokens
    if r.max_new_tokens is not None:
        obj["max_new_tokens"] = r.max_new_tokens
    if r.priority:
        obj["priority"] = r.priority
    if r.arrival_ms:
        obj["arrival_ms"] = r.arrival_ms
    if r.deadline_ms is not None:
        obj["deadline_ms"] = r.deadline_ms
    if r.cancel_ms is not None:
        obj["cancel_ms"] = r.cancel_ms
    return json.dumps(obj, separators=(",", ":"))


def write_jsonl(requests: Iterable[Request], path: str | Path) -> int:
    """Write ``requests`` to ``path`` (a temporary name first, then renamed; parent folders
    are created); returns how many lines were written."""
    path = Path(path)
    text = "".join(request_json(r) + "\n" for r in requests)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{path}: cannot write the workload ({reason(err)})") from None
    if path.is_dir():
        raise InputError(
            f"{path}: cannot write the workload (is a directory; allowed: a file path)"
        )
    try:
        write_atomic(path, text)  # a failed write (a full disk) leaves no temporary file
    except OutputError as err:
        raise OutputError(f"{err} (the workload)") from None
    return text.count("\n")


def export_workload(spec: WorkloadSpec, seed: int, path: str | Path) -> int:
    """Load the workload ``spec`` describes (``seed``: the experiment's) and write it to
    ``path``; returns the number of requests."""
    return write_jsonl(load_workload(spec, seed=seed), path)
