"""Requests for the block policies (conservative, optimistic), from any ``admit.workload`` source.

A ``jsonl`` file may hold block requests (``rid``, ``prompt_tokens``, ``max_new_tokens``)
or the prefill model's requests (``rid``, ``extend_tokens``, ...), line by line. Prefill
requests (and those of every other source) become block requests whose prompt is their
whole fill length ``l1 + l2 + extend``; a missing ``max_new_tokens`` takes
``admit.max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable

from cpkv.core.errors import InputError
from cpkv.core.files.jsonl import check_fields, parse_object
from cpkv.core.schema.limits import token_field_problem
from cpkv.policies.blocks import BlockRequest
from cpkv.workload.request import Request
from cpkv.workload.sources import (
    WorkloadSpec,
    check_new_rid,
    jsonl_text,
    load_workload,
    parse_request_line,
    request_id,
)

BLOCK_FIELDS = ("rid", "prompt_tokens", "max_new_tokens")


def block_requests_from(
    requests: Iterable[Request], default_max_new_tokens: int
) -> tuple[BlockRequest, ...]:
    """Prefill-model requests as block requests: the whole fill length is the prompt."""
    return tuple(
        BlockRequest(
            r.rid,
            r.fill_tokens,
            default_max_new_tokens if r.max_new_tokens is None else r.max_new_tokens,
        )
        for r in requests
    )


def load_block_requests(
    spec: WorkloadSpec, default_max_new_tokens: int
) -> tuple[BlockRequest, ...]:
    """The block requests ``spec`` describes, in queue order."""
    if spec.source != "jsonl":
        return block_requests_from(load_workload(spec), default_max_new_tokens)
    path, text = jsonl_text(spec)
    out: list[BlockRequest] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        req = _parse_line(line, where, default_max_new_tokens)
        check_new_rid(req.rid, seen, where)
        out.append(req)
    return tuple(out)


def _parse_line(line: str, where: str, default_max_new_tokens: int) -> BlockRequest:
    obj = parse_object(line, where)
    if "prompt_tokens" not in obj:
        # a prefill-model request (its parser names what is wrong)
        return block_requests_from([parse_request_line(line, where)], default_max_new_tokens)[0]
    check_fields(obj, BLOCK_FIELDS, where, " for a block request")
    rid = request_id(obj, where)
    obj.setdefault("max_new_tokens", default_max_new_tokens)
    for key in ("prompt_tokens", "max_new_tokens"):
        v = obj[key]
        problem = token_field_problem(v) if type(v) is int else "must be an integer >= 0"
        if problem is not None:
            raise InputError(f"{where}: field {key!r} {problem}, got {v!r}")
    return BlockRequest(rid, obj["prompt_tokens"], obj["max_new_tokens"])
