"""A schema's keys as a whole: every leaf with its type and bounds, the bounds of an object
made without :func:`~cpkv.core.schema.build`, and keys that only another choice reads.

* :func:`leaves`: every key that holds a value (nested blocks walked), with its type, its
  bounds (:class:`~cpkv.core.schema.Range`) and its default: what documentation and the
  edge-value property test read;
* :func:`check_bounds`: the bounds of one block's fields, for an object a caller built
  directly;
* :func:`belongs_to`: a key set to other than its default that only another choice of some
  key reads (a router's threshold under another router, a cost kind's coefficient under
  the other kind) is refused in one line, saying which choice reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from cpkv.core.schema.fields import FieldError, Range, field_form


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One key of a schema (:func:`leaves`): its dotted path, its type without bounds or
    ``None``, whether null is allowed, whether it is a list of such values, its bounds and
    its default."""

    key: str
    type: Any
    nullable: bool
    is_list: bool
    ranges: tuple[Range, ...]
    default: Any


def leaves(cls: type, path: str = "", defaults: Any = None) -> list[Leaf]:
    """Every key of the dataclass schema ``cls`` that holds a value (nested dataclasses
    walked), in declaration order, with its default (that of ``defaults``, an instance of
    ``cls``, when given)."""
    out: list[Leaf] = []
    default_obj = defaults if defaults is not None else _default_instance(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{path}.{f.name}" if path else f.name
        default = getattr(default_obj, f.name, None) if default_obj is not None else None
        tp, nullable, is_list, ranges = field_form(cls, f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and not is_list:
            out.extend(leaves(tp, key, default))
            continue
        out.append(Leaf(key, tp, nullable, is_list, ranges, default))
    return out


def check_bounds(obj: Any) -> None:
    """FieldError for the first field of the dataclass instance ``obj`` (not its nested
    blocks) outside its type's bounds: for objects made without :func:`build`."""
    for f in dataclasses.fields(obj):
        _, _, is_list, ranges = field_form(type(obj), f.name)
        value = getattr(obj, f.name)
        items = enumerate(value or ()) if is_list else ((None, value),)
        for i, item in items:
            for r in ranges:
                r.check(f.name if i is None else f"{f.name}[{i}]", item)


def belongs_to(
    obj: Any, keys: Iterable[str], *, owner: str, needed: str, chosen: str, reads: Iterable[str]
) -> None:
    """Refuse a key of ``keys`` that ``obj`` sets to other than its default: only the choice
    ``needed`` of the key ``owner`` (a dotted path: ``admit.cost.kind``) reads it, and
    ``owner`` is ``chosen`` here; ``reads``: the keys ``chosen`` reads, for the message."""
    default = type(obj)()
    label = owner.rsplit(".", 1)[-1]
    for key in keys:
        if getattr(obj, key) != getattr(default, key):
            read = ", ".join(reads) or "none of them"
            raise FieldError(
                key,
                f"belongs to {label} {needed}, and this {owner} is {chosen} (it would be "
                f"ignored); set {owner}={needed} to use it, or remove it ({label} {chosen} "
                f"reads: {read})",
            )


def _default_instance(cls: type) -> Any:
    try:
        return cls()
    except TypeError:  # a schema with required fields: no defaults to show
        return None
