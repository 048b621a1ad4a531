"""Result records: frozen row dataclasses in, a versioned JSON document out.

A row class marks its fields with :func:`metric` (numbers to compare across runs,
``timing=True`` for noisy wall-clock numbers), :func:`outcome` (non-numeric results,
such as the request that stopped a batch) or :func:`samples` (the raw timing samples behind
a row's timing statistics, which ``cpkv diff`` rank-tests). Every other field is an
*identity* field: rows of two runs are matched on their identity fields by ``cpkv diff``.

A run's ``summary`` may say which of its numbers are better lower or higher
(``summary_directions``: dotted key -> ``"lower"`` / ``"higher"``, or ``"neutral"`` for a
number that is neither, such as a count of calls); ``cpkv diff`` judges those and reports any
other summary change as ``changed``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.core.errors import InputError
from cpkv.core.schema import to_dict

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)


def metric(*, unit: str = "", timing: bool = False, lower_is_better: bool = True, **kw: Any) -> Any:
    """A dataclass field holding a number to compare across runs."""
    meta = {"role": "metric", "unit": unit, "timing": timing, "lower_is_better": lower_is_better}
    return field(metadata=meta, **kw)


def outcome(**kw: Any) -> Any:
    """A dataclass field holding a non-numeric result (compared for equality, not matched on)."""
    return field(metadata={"role": "outcome"}, **kw)


def samples(*, unit: str = "us", **kw: Any) -> Any:
    """A dataclass field holding a row's raw timing samples (a list, at most
    :data:`cpkv.core.timing.SAMPLES_KEPT`): ``samples_<unit>`` backs every timing metric
    ``<stat>_<unit>`` of the row in ``cpkv diff``'s rank test."""
    return field(metadata={"role": "samples", "unit": unit}, **kw)


@dataclass(frozen=True)
class Columns:
    """How the fields of a row class are used: matched on, compared, or reported."""

    identity: tuple[str, ...]
    metrics: tuple[str, ...]
    timing: tuple[str, ...]
    outcomes: tuple[str, ...]
    lower_is_better: tuple[str, ...] = ()
    samples: tuple[str, ...] = ()  # raw timing samples (absent from results of cpkv <= 0.1)

    @classmethod
    def of(cls, row_cls: type) -> Columns:
        identity, metrics, timing, outcomes, lower, raw = [], [], [], [], [], []
        for f in dataclasses.fields(row_cls):
            role = f.metadata.get("role")
            if role == "samples":
                raw.append(f.name)
            elif role == "metric":
                metrics.append(f.name)
                if f.metadata.get("timing"):
                    timing.append(f.name)
                if f.metadata.get("lower_is_better", True):
                    lower.append(f.name)
            elif role == "outcome":
                outcomes.append(f.name)
            else:
                identity.append(f.name)
        return cls(
            tuple(identity),
            tuple(metrics),
            tuple(timing),
            tuple(outcomes),
            tuple(lower),
            tuple(raw),
        )


@dataclass(frozen=True)
class RunOutput:
    """What a kind's runner returns: rows (frozen dataclasses), a summary, extra files."""

    rows: Sequence[Any]
    summary: Mapping[str, Any] = field(default_factory=dict)
    extras: Mapping[str, str] = field(default_factory=dict)
    table_columns: Sequence[str] | None = None
    notes: Sequence[str] = ()
    summary_directions: Mapping[str, str] = field(default_factory=dict)


DIRECTIONS = ("lower", "higher", "neutral")


@dataclass(frozen=True)
class RunRecord:
    """The content of ``results.json``."""

    kind: str
    name: str
    columns: Columns
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    table_columns: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    summary_directions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_output(
        cls, kind: str, name: str, output: RunOutput, row_cls: type | None = None
    ) -> RunRecord:
        rows = list(output.rows)
        if row_cls is None and rows:
            row_cls = type(rows[0])
        columns = Columns.of(row_cls) if row_cls is not None else Columns((), (), (), ())
        return cls(
            kind=kind,
            name=name,
            columns=columns,
            rows=[to_dict(r) for r in rows],
            summary=to_dict(dict(output.summary)),
            table_columns=list(output.table_columns) if output.table_columns else None,
            notes=list(output.notes),
            summary_directions=dict(output.summary_directions),
        )

    def to_json(self) -> str:
        doc = {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "name": self.name,
            "columns": to_dict(self.columns),
            "table_columns": self.table_columns,
            "notes": self.notes,
            "summary": self.summary,
            "rows": self.rows,
        }
        if self.summary_directions:
            doc["summary_directions"] = self.summary_directions
        return json.dumps(finite_json(doc), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "results.json") -> RunRecord:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"{source}:{err.lineno}: not valid JSON ({err.msg})") from None
        except RecursionError:
            raise InputError(f"{source}: not a cpkv results file (nested too deeply)") from None
        if not isinstance(doc, dict) or "schema_version" not in doc:
            raise InputError(f"{source}: not a cpkv results file (no schema_version)")
        version = doc["schema_version"]
        if version not in SUPPORTED_SCHEMA_VERSIONS:
            allowed = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
            raise InputError(
                f"{source}: schema_version {version!r} is not supported by cpkv (supported: {allowed})"
            )

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InputError(f"{source}: malformed cpkv results file ({what})")

        for key in ("kind", "name", "columns", "rows", "summary"):
            need(key in doc, f"no {key!r}")
        cols, rows = doc["columns"], doc["rows"]
        need(isinstance(cols, dict), "'columns' is not an object")
        names = {f.name for f in dataclasses.fields(Columns)}
        need(set(cols) <= names, f"'columns' holds {sorted(set(cols) - names)}")
        for key in ("identity", "metrics", "timing", "outcomes"):
            need(_strings(cols.get(key)), f"'columns.{key}' is not a list of names")
        need(
            _strings(cols.get("lower_is_better", [])),
            "'columns.lower_is_better' is not a list of names",
        )
        need(isinstance(rows, list), "'rows' is not a list")
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        need(bad is None, f"row {bad} is not an object")
        need(isinstance(doc["summary"], dict), "'summary' is not an object")
        table_columns = doc.get("table_columns")
        need(
            table_columns is None or _strings(table_columns),
            "'table_columns' is not a list of names",
        )
        notes = doc.get("notes") or []
        need(isinstance(notes, list), "'notes' is not a list")
        need(
            isinstance(doc.get("summary_directions") or {}, dict),
            "'summary_directions' is not an object",
        )
        return cls(
            kind=str(doc["kind"]),
            name=str(doc["name"]),
            columns=Columns(**{k: tuple(v) for k, v in cols.items()}),
            rows=list(rows),
            summary=dict(doc["summary"]),
            table_columns=table_columns,
            notes=[str(n) for n in notes],
            schema_version=version,
            summary_directions=dict(doc.get("summary_directions") or {}),
        )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def finite_json(obj: Any) -> Any:
    """``obj`` with every NaN/inf (not valid JSON) replaced by None, in nested dicts and lists."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    return obj
