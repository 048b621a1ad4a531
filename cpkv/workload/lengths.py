"""Empirical prompt and output lengths from a user's file, for the ``synthetic`` source.

``admit.workload.synthetic.lengths: {path, prompt_field, output_field}`` names a file of
measured (prompt, output) length pairs, e.g. the lengths of a ShareGPT sample or of a
production log: a CSV with a header row, or JSONL with one object per line (by the file's
suffix: ``.csv``, else JSONL). Each synthetic request draws one row uniformly, with
replacement, so the joint distribution (long prompts with short answers, heavy tails) is the
file's. The row's prompt is the whole prompt: the request's L1 and L2 hits, drawn from their
distributions, are clipped into it (at most ``prompt - 1`` cached tokens: SGLang always
computes one), and the rest is its extend; the row's output is its ``max_new_tokens``.

Every row is checked as it is read: both fields present, integers of at least 1 and at most
:data:`~cpkv.core.schema.limits.MAX_TOKENS`; a bad row is one error naming the file, the line
and the field.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.errors import InputError
from cpkv.core.files.jsonl import parse_object, read_text, require_file
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY


@dataclass(frozen=True)
class LengthsFile:
    """``admit.workload.synthetic.lengths``: the file and the names of its two fields."""

    path: str
    prompt_field: str = "prompt_tokens"
    output_field: str = "output_tokens"


def _length(value: object, where: str, field: str) -> int:
    """``value`` as a token count of at least 1, or InputError naming ``where`` and ``field``."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise InputError(f"{where}: field {field!r}: expected an integer >= 1, got {value!r}")
        number = int(text)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise InputError(f"{where}: field {field!r}: expected an integer >= 1, got {value!r}")
    if number < 1:
        raise InputError(f"{where}: field {field!r}: must be >= 1, got {number}")
    if number > MAX_TOKENS:
        raise InputError(f"{where}: field {field!r}: must be <= {MAX_TOKENS} ({TOKENS_WHY})")
    return number


def _csv_rows(path: Path, text: str):
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        raise InputError(f"{path}:1: empty file; expected a header row naming the length fields")
    header = tuple(name.strip() for name in reader.fieldnames)
    reader.fieldnames = list(header)
    for row in reader:
        yield reader.line_num, row, header


def _jsonl_rows(path: Path, text: str):
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            row = parse_object(line, f"{path}:{lineno}")
            yield lineno, row, tuple(row)


def read_lengths(spec: LengthsFile) -> tuple[tuple[int, int], ...]:
    """The (prompt, output) pairs of ``spec.path``, in file order; InputError for a missing
    or empty file or any bad row."""
    path = Path(spec.path)
    require_file(path, "admit.workload.synthetic.lengths.path", "the lengths file")
    text = read_text(path, "the lengths file")
    rows = _csv_rows(path, text) if path.suffix.lower() == ".csv" else _jsonl_rows(path, text)
    pairs = []
    for lineno, row, fields in rows:
        where = f"{path}:{lineno}"
        for field in (spec.prompt_field, spec.output_field):
            if row.get(field) in (None, ""):
                raise InputError(
                    f"{where}: no field {field!r} (fields here: {', '.join(fields) or 'none'}); "
                    "set admit.workload.synthetic.lengths.prompt_field / output_field"
                )
        pairs.append(
            (
                _length(row[spec.prompt_field], where, spec.prompt_field),
                _length(row[spec.output_field], where, spec.output_field),
            )
        )
    if not pairs:
        raise InputError(f"{path}: holds no length row")
    return tuple(pairs)


def split_prompt(prompt: int, l1: int, l2: int) -> tuple[int, int, int]:
    """``(l1, l2, extend)`` of a ``prompt``-token request whose drawn hits were ``l1`` and
    ``l2``: the hits clipped so that at least one token is computed."""
    l1 = min(l1, prompt - 1)
    l2 = min(l2, prompt - 1 - l1)
    return l1, l2, prompt - l1 - l2
