"""Reading JSON Lines input files (every error names the file, line and what is allowed), and
writing strict ones (:func:`json_lines`: no NaN or Infinity, which no JSON reader accepts)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from cpkv.core.errors import InputError
from cpkv.core.suggest import did_you_mean


def json_lines(rows: Iterable[Any], name: str) -> str:
    """One compact JSON object per line; RuntimeError naming ``name`` and the line for a
    number that is not finite (a bug: every output is finite or the run is refused)."""
    out = []
    for lineno, row in enumerate(rows, 1):
        try:
            out.append(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
        except ValueError:
            raise RuntimeError(
                f"internal error: {name}:{lineno} would hold NaN or Infinity: {row!r}"[:400]
            ) from None
    return "".join(out)


def require_file(path: Path, key: str, what: str = "") -> None:
    """InputError naming config ``key`` unless ``path`` is a file (a relative path says the
    directory it was looked for in)."""
    if not path.is_file():
        where = "" if path.is_absolute() else f"; a relative path is read from {Path.cwd()}"
        named = f"{what} {path}" if what else str(path)
        raise InputError(f"{key}: {named} does not exist or is not a file{where}")


def read_text(path: Path, what: str) -> str:
    """The text of ``path``; InputError ``<path>: cannot read <what> (<reason>)``, or naming the
    byte offset of the first byte that is not UTF-8."""
    from cpkv.core.files.yaml_input import decode_utf8

    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    return decode_utf8(data, str(path), InputError)


def parse_object(line: str, where: str) -> dict[str, Any]:
    """One line as a JSON object; InputError naming ``where`` (``file:line``) otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply; expected a flat JSON object") from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def check_fields(obj: dict[str, Any], allowed: Collection[str], where: str, of: str = "") -> None:
    """InputError for the first key of ``obj`` not in ``allowed``; ``of`` (such as
    ``" for a block request"``) follows the field's name in the message."""
    for key in obj:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise InputError(
                f"{where}: unknown field {key!r}{of}{hint} (allowed: {', '.join(allowed)})"
            )
