"""Request traces: one reader per trace format, registered by format name.

A trace is read into `TraceRequest` records that keep each request's order index (its position
among the trace's requests, counted from 0 over the whole file) and its arrival time, so the
serving simulation can replay arrivals. Prompts are described by prefix-block hashes: block `i`
of a request covers tokens `[i * block_size, min((i + 1) * block_size, input_length))`, so every
block is full except possibly the last, which covers `input_length - (n - 1) * block_size`
tokens (see `TraceRequest.block_tokens`).

Every numeric field a reader takes is bounded (:mod:`cpkv.core.schema.limits`): token counts within
int32 (SGLang's token index), times within the simulation clock's range (2**53 µs),
priorities and block hashes within int64; a field outside is one line naming the file, the
line and the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.errors import ConfigError, InputError
from cpkv.core.files.jsonl import require_file
from cpkv.core.registry import Registry
from cpkv.core.schema.limits import INT64_MAX, time_field_problem, token_field_problem
from cpkv.trace.prefix_model import NO_PREFIX_FORMATS, PrefixSpec, apply_prefix


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.

    `index` is the request's order in the trace file (0-based, blank lines not counted);
    `hash_ids[i]` names the content of prefix block `i` (equal hashes mean equal tokens).
    """

    index: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    # optional (Mooncake lines may carry them; the serving simulation reads them)
    priority: int | None = None
    deadline_ms: float | None = None  # TTFT deadline after the arrival
    cancel_ms: float | None = None  # the client cancels this long after the arrival

    def block_tokens(self, i: int, block_size: int) -> int:
        """Tokens covered by block `i` of this request: `block_size`, except the last block."""
        return min(block_size, self.input_length - i * block_size)


@dataclass(frozen=True)
class Trace:
    """The requests read from one trace file, in file order."""

    path: str
    format: str
    block_size: int
    requests: tuple[TraceRequest, ...]


Reader = Callable[[Path, int, int, "int | None"], Iterator[TraceRequest]]
TRACE_FORMATS: Registry[Reader] = Registry("trace format")
"""Trace readers by format name: `(path, block_size, start, limit) -> iterator of TraceRequest`."""


def read_trace(
    path: str | Path,
    format: str = "mooncake",
    block_size: int = 512,
    start: int = 0,
    limit: int | None = None,
    path_key: str = "trace.path",
    prefix: PrefixSpec | None = None,
) -> Trace:
    """Read requests `start .. start + limit - 1` (by order index) of a trace file; ``path_key``
    names the config key of ``path`` in the error for a missing file; ``prefix`` lays a
    synthetic shared prefix over a trace without prefix information (`cpkv.trace.prefix_model`;
    ConfigError for a format that has its own, naming ``path_key``'s block).

    Raises `ConfigError` for a bad format name or argument and `InputError` for a missing file
    or a malformed line (naming the file, the line number, the field and what is allowed).
    """
    reader = TRACE_FORMATS.get(format)
    for key, value, low in (("block_size", block_size, 1), ("start", start, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"trace {key}={value!r} is not allowed; use an integer >= {low}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"trace limit={limit!r} is not allowed; use null or an integer >= 0")
    name = TRACE_FORMATS.canonical(format)
    synthetic = prefix is not None and prefix.model != "none"
    if synthetic and name not in NO_PREFIX_FORMATS:
        block = path_key.rsplit(".", 1)[0]
        raise ConfigError(
            f"{block}.prefix.model={prefix.model}: the {name} format carries its own prefix hashes; "
            f"a synthetic prefix applies to traces without them ({', '.join(NO_PREFIX_FORMATS)}); "
            "allowed here: none"
        )
    file = Path(path)
    require_file(file, path_key, "trace file")
    key = _read_key(file, name, block_size, start, limit, prefix if synthetic else None)
    if key in _READ:
        _READ.move_to_end(key)
        return dataclasses.replace(_READ[key], path=str(file))
    requests = tuple(reader(file, block_size, start, limit))
    if synthetic:
        requests = tuple(apply_prefix(requests, prefix, block_size))
    trace = Trace(str(file), name, block_size, requests)
    if key is not None:
        _READ[key] = trace
        while len(_READ) > KEPT_TRACES:
            _READ.popitem(last=False)
    return trace


KEPT_TRACES = 4
KEPT_FILE_BYTES = 32 << 20
_READ: OrderedDict[tuple, Trace] = OrderedDict()
"""The last traces read from files of at most KEPT_FILE_BYTES, by content (a trace is
immutable): the points of a sweep, or of its dry run, that read one file parse it once."""


def _read_key(file: Path, *reading: object) -> tuple | None:
    """What identifies one reading of ``file`` as it is now: its content's digest and the
    reading's arguments (None: too large to keep, or a prefix model that is not hashable)."""
    if file.stat().st_size > KEPT_FILE_BYTES:
        return None
    key = (hashlib.blake2b(file.read_bytes(), digest_size=16).digest(), *reading)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _bad(file: Path, lineno: int, field: str, allowed: str, value: object) -> InputError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InputError(f"{file}:{lineno}: field {field!r} {allowed}, got {shown}")


def _int_field(file: Path, lineno: int, row: dict, field: str, low: int) -> int:
    """A token count: an integer in ``[low, MAX_TOKENS]``."""
    if field not in row:
        raise InputError(f"{file}:{lineno}: field {field!r} is missing (an integer >= {low})")
    value = row[field]
    problem = token_field_problem(value, low)
    if problem is not None:
        raise _bad(file, lineno, field, problem, value)
    return value


def _is_int64(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int)
        and -INT64_MAX - 1 <= value <= INT64_MAX
    )


@TRACE_FORMATS.register("mooncake")
def read_mooncake(
    file: Path, block_size: int, start: int, limit: int | None
) -> Iterator[TraceRequest]:
    """Mooncake FAST'25 JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

    `hash_ids` must hold exactly `ceil(input_length / block_size)` integers; optional
    `priority` (an integer), `deadline_ms` and `cancel_ms` (milliseconds after the arrival,
    read by the serving simulation); other keys are ignored. Lines before `start` are counted
    but not parsed.
    """
    stop = None if limit is None else start + limit
    index = 0
    for lineno, line in _text_lines(file):
        if not line.strip():
            continue
        if stop is not None and index >= stop:
            return
        if index >= start:
            yield _parse_mooncake(file, lineno, line, index, block_size)
        index += 1


def _text_lines(file: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line; InputError naming the line and the byte offset of
    the first byte that is not UTF-8."""
    offset = 0
    try:
        with file.open("rb") as raw_lines:
            for lineno, raw in enumerate(raw_lines, start=1):
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    bad = raw[err.start : err.start + 1].hex()
                    raise InputError(
                        f"{file}:{lineno}: not UTF-8 text (byte 0x{bad} at offset "
                        f"{offset + err.start}); allowed: a UTF-8 text file"
                    ) from None
                offset += len(raw)
    except OSError as err:
        raise InputError(f"{file}: cannot read the trace ({err.strerror or err})") from None


def _parse_mooncake(file: Path, lineno: int, line: str, index: int, block_size: int):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{file}:{lineno}: not valid JSON ({exc.msg}); expected one object"
        ) from None
    except RecursionError:
        raise InputError(f"{file}:{lineno}: nested too deeply; expected one flat object") from None
    if not isinstance(row, dict):
        raise InputError(f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}")
    if "timestamp" not in row:
        raise InputError(f"{file}:{lineno}: field 'timestamp' is missing (milliseconds >= 0)")
    stamp = row["timestamp"]
    problem = time_field_problem(stamp)
    if problem is not None:
        raise _bad(file, lineno, "timestamp", problem, stamp)
    input_length = _int_field(file, lineno, row, "input_length", 1)
    output_length = _int_field(file, lineno, row, "output_length", 0)
    if "hash_ids" not in row:
        raise InputError(f"{file}:{lineno}: field 'hash_ids' is missing (a list of integers)")
    hashes = row["hash_ids"]
    if not isinstance(hashes, list):
        raise _bad(file, lineno, "hash_ids", "must be a list of integers", hashes)
    blocks = -(-input_length // block_size)
    if len(hashes) != blocks:
        raise InputError(
            f"{file}:{lineno}: field 'hash_ids' has {len(hashes)} entries; it must have"
            f" ceil(input_length / block_size) = ceil({input_length} / {block_size}) = {blocks}"
            " (is block_size right?)"
        )
    for value in hashes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(file, lineno, "hash_ids", "must hold integers only", value)
        if not _is_int64(value):
            raise _bad(file, lineno, "hash_ids", "must hold 64-bit integers", value)
    if "priority" in row or "deadline_ms" in row or "cancel_ms" in row:
        return TraceRequest(
            index, stamp, input_length, output_length, tuple(hashes), *_optional(file, lineno, row)
        )
    return TraceRequest(index, stamp, input_length, output_length, tuple(hashes))


def _optional(file: Path, lineno: int, row: dict) -> tuple[int | None, float | None, float | None]:
    """A Mooncake line's optional ``priority``, ``deadline_ms``, ``cancel_ms``."""
    priority = row.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise _bad(file, lineno, "priority", "must be an integer", priority)
    if priority is not None and not _is_int64(priority):
        raise _bad(file, lineno, "priority", "must be a 64-bit integer", priority)
    times = []
    for key in ("deadline_ms", "cancel_ms"):
        v = row.get(key)
        problem = None if v is None else time_field_problem(v)
        if problem is not None:
            raise _bad(file, lineno, key, problem, v)
        times.append(None if v is None else float(v))
    return priority, times[0], times[1]


AZURE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
AZURE_HASH_BASE = -(1 << 40)
"""Azure requests carry no prefix information: each gets block hashes of its own, negative
(Mooncake's are not) and distinct per request, so no two requests share a prefix block
(unless a synthetic prefix model is laid over them: `cpkv.trace.prefix_model`)."""


@TRACE_FORMATS.register(
    "azure_csv", help="Azure LLM inference trace 2023 CSV (arrived_at s, prefill/decode tokens)"
)
def read_azure_csv(
    file: Path, block_size: int, start: int, limit: int | None
) -> Iterator[TraceRequest]:
    """The Azure LLM inference traces of 2023 as Vidur ships them: a plain CSV (no quoted
    fields) with a header holding
    ``arrived_at`` (seconds from the start), ``num_prefill_tokens`` (>= 1) and
    ``num_decode_tokens`` (>= 0); other columns are ignored.

    The traces hold no prefix information: every request gets hashes no other request has
    (no prefix sharing, so a prefix cache never hits). Rows before ``start`` are counted but
    not parsed.
    """
    stop = None if limit is None else start + limit
    lines = _text_lines(file)
    first = next(lines, None)
    if first is None:
        raise InputError(f"{file}:1: empty file; expected a header with {', '.join(AZURE_COLUMNS)}")
    names = [name.strip() for name in first[1].rstrip("\r\n").split(",")]
    missing = [c for c in AZURE_COLUMNS if c not in names]
    if missing:
        raise InputError(
            f"{file}:1: header lacks column(s) {', '.join(missing)}"
            f" (an azure_csv trace has {', '.join(AZURE_COLUMNS)})"
        )
    at = [names.index(c) for c in AZURE_COLUMNS]
    index = 0
    for lineno, line in lines:
        if not line.strip():
            continue
        if stop is not None and index >= stop:
            return
        if index >= start:
            yield _parse_azure(file, lineno, line.rstrip("\r\n").split(","), at, index, block_size)
        index += 1


def _parse_azure(
    file: Path, lineno: int, row: list[str], at: list[int], index: int, block_size: int
) -> TraceRequest:
    if len(row) <= max(at):
        raise InputError(
            f"{file}:{lineno}: {len(row)} columns; the header names {max(at) + 1} or more"
        )
    arrived, prefill, decode = (row[i].strip() for i in at)
    try:
        seconds = float(arrived)
    except ValueError:
        seconds = math.nan
    problem = time_field_problem(seconds, 1e3, "seconds")
    if problem is not None:
        raise _bad(file, lineno, "arrived_at", problem, arrived)
    input_length = _csv_int(file, lineno, "num_prefill_tokens", prefill, 1)
    output_length = _csv_int(file, lineno, "num_decode_tokens", decode, 0)
    blocks = -(-input_length // block_size)
    first = AZURE_HASH_BASE - index * (1 << 20)
    if blocks >= 1 << 20:
        raise _bad(
            file,
            lineno,
            "num_prefill_tokens",
            f"must need fewer than 2**20 blocks of {block_size}",
            prefill,
        )
    return TraceRequest(
        index,
        seconds * 1000.0,
        input_length,
        output_length,
        tuple(range(first, first - blocks, -1)),
    )


def _csv_int(file: Path, lineno: int, field: str, text: str, low: int) -> int:
    """A token count: an integer in ``[low, MAX_TOKENS]``."""
    try:
        value = int(text)
    except ValueError:
        raise _bad(file, lineno, field, f"must be an integer >= {low}", text) from None
    problem = token_field_problem(value, low)
    if problem is not None:
        raise _bad(file, lineno, field, problem, text)
    return value
