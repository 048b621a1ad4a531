"""Reading YAML that a user (or a damaged run directory) hands to cpkv, with bounds.

Plain ``yaml.safe_load`` accepts input that takes a config loader down: a repeated key silently
keeps its last value, ten lines of nested aliases expand to billions of values (a *billion
laughs*), twenty thousand nested brackets end in ``RecursionError``, and a 50 MB file takes
minutes. :func:`load_yaml` refuses each of these with one :class:`~cpkv.core.errors.CpkvError`
line naming the file (and the line) *before* anything downstream (OmegaConf, the schema) sees
the data:

* the file is larger than ``max_bytes`` (default :data:`MAX_CONFIG_BYTES`);
* the text is not UTF-8 (the message gives the byte offset);
* a mapping repeats a key (both lines are named);
* values nest deeper than ``max_depth`` (aliases expanded);
* the document holds more than ``max_values`` values once its aliases are expanded.

The checks run while the document is composed, so a bomb is refused after reading at most
``max_values`` nodes; the pure-Python composer is used because it can be bounded (the limits
keep it fast: the largest config allowed, 25,000 values, is answered in about 5 s, OmegaConf
included; a bomb is refused in a fraction of a second).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cpkv.core.errors import CpkvError

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file (1 MiB: far more than any config needs; a shipped one is under 4 KiB)."""
MAX_DEPTH = 32
"""Deepest nesting of mappings and lists (a cpkv config nests 4 levels)."""
MAX_VALUES = 25_000
"""Most values (scalars, lists, mappings) in one document, aliases expanded: OmegaConf takes
about 0.2 ms per value, so the largest config allowed is answered in about 5 s."""


@dataclass(frozen=True)
class Limits:
    """Bounds for one kind of YAML input."""

    max_bytes: int = MAX_CONFIG_BYTES
    max_depth: int = MAX_DEPTH
    max_values: int = MAX_VALUES


CONFIG_LIMITS = Limits()
"""For config files (`cpkv admit CONFIG.yaml`, `cpkv sweep CONFIG.yaml`)."""
RECORD_LIMITS = Limits(max_bytes=256 << 20, max_values=20_000_000)
"""For files cpkv wrote itself (sweep.yaml with every point's config, a run's config.yaml)."""


class _Refused(Exception):
    """Internal: a bound was exceeded; the message is complete (file and line included)."""


def decode_utf8(data: bytes, where: str, error_cls: type[Exception] = _Refused) -> str:
    """``data`` as text; ``error_cls`` naming ``where`` and the byte offset when not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1].hex()
        raise error_cls(
            f"{where}: not UTF-8 text (byte 0x{bad} at offset {err.start}); "
            "allowed: a UTF-8 text file"
        ) from None


def read_yaml_file(
    path: str | Path,
    error_cls: type[CpkvError],
    limits: Limits = CONFIG_LIMITS,
    what: str = "YAML file",
) -> Any:
    """The one YAML document of ``path`` (None when empty); ``error_cls`` for anything wrong.

    The message names the file and, when it can, the line: missing or unreadable files, size,
    encoding, invalid YAML, more than one document, and every bound of :class:`Limits`.
    """
    p = Path(path)
    if not p.exists():
        raise error_cls(f"{path}: {what} not found")
    if p.is_dir():
        raise error_cls(f"{path}: is a directory, expected a {what}")
    try:
        size = p.stat().st_size
        if size > limits.max_bytes:
            raise error_cls(
                f"{path}: {_mib(size)} is too large for a {what}; allowed: up to {_mib(limits.max_bytes)}"
            )
        with p.open("rb") as fh:  # read at most one byte past the limit (the file may grow)
            data = fh.read(limits.max_bytes + 1)
    except OSError as err:
        raise error_cls(f"{path}: cannot read ({err.strerror or err})") from None
    if len(data) > limits.max_bytes:
        raise error_cls(f"{path}: larger than {_mib(limits.max_bytes)}; allowed: up to that")
    try:
        return load_yaml(decode_utf8(data, str(path)), str(path), limits)
    except _Refused as err:
        raise error_cls(str(err)) from None


def load_yaml(text: str, where: str, limits: Limits = CONFIG_LIMITS) -> Any:
    """Parse one YAML document from ``text`` within ``limits``; ``_Refused`` (internal) or
    :class:`yaml.YAMLError` converted to a one-line message naming ``where`` and the line."""
    if len(text) > limits.max_bytes:
        raise _Refused(f"{where}: larger than {_mib(limits.max_bytes)}; allowed: up to that")
    loader = _BoundedLoader(text, where, limits)
    try:
        docs = []
        while loader.check_node():
            doc = loader.construct_document(loader.get_node())
            if doc is not None:
                docs.append(doc)
            if len(docs) > 1:
                raise _Refused(f"{where}: holds more than one YAML document; one per file")
        return docs[0] if docs else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise _Refused(f"{where}{line}: invalid YAML ({problem})") from None
    except RecursionError:  # a bound below should always come first
        raise _Refused(f"{where}: nested too deeply; allowed: {limits.max_depth} levels") from None
    finally:
        loader.dispose()


def parse_yaml(
    text: str, where: str, error_cls: type[CpkvError], limits: Limits = CONFIG_LIMITS
) -> Any:
    """:func:`load_yaml` raising ``error_cls`` (a :class:`CpkvError`) instead of the internal error."""
    try:
        return load_yaml(text, where, limits)
    except _Refused as err:
        raise error_cls(str(err)) from None


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.3g} MiB" if size >= 1 << 20 else f"{size / 1024:.3g} KiB"


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader that counts values and depth while composing, aliases expanded, and
    refuses duplicate mapping keys."""

    def __init__(self, text: str, where: str, limits: Limits) -> None:
        super().__init__(text)
        self._where = where
        self._limits = limits
        self._depth = 0
        self._total = 0
        self._aliases = False  # an alias was seen: counts are of the expanded document
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > self._limits.max_depth:
            raise _Refused(
                f"{self._where}:{self.peek_event().start_mark.line + 1}: nested more than "
                f"{self._limits.max_depth} levels deep; allowed: {self._limits.max_depth}"
            )
        alias = self.check_event(yaml.AliasEvent)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        values, depth = self._measure(node)
        if alias:  # a reference: it adds the whole expanded subtree again
            self._total += values
            self._aliases = True
        else:
            self._total += 1
        if self._total > self._limits.max_values:
            raise _Refused(
                f"{self._where}:{node.start_mark.line + 1}: more than {self._limits.max_values:,} "
                f"values{' once its aliases are expanded' if self._aliases else ''}; allowed: "
                f"{self._limits.max_values:,}"
            )
        if self._depth + depth > self._limits.max_depth:
            raise _Refused(
                f"{self._where}:{node.start_mark.line + 1}: nested more than "
                f"{self._limits.max_depth} levels deep once its aliases are expanded; "
                f"allowed: {self._limits.max_depth}"
            )
        return node

    def _measure(self, node: Any) -> tuple[int, int]:
        """(values, depth) of ``node`` with aliases expanded, from its children's (memoised)."""
        known = self._expanded.get(id(node))
        if known is not None:
            return known
        values, depth = 1, 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            v, d = self._expanded.get(id(child), (1, 1))
            values += v
            depth = max(depth, d + 1)
        self._expanded[id(node)] = (values, depth)
        return values, depth

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _Refused(
                        f"{self._where}:{line}: duplicate key {key!r} (first at line {first}); "
                        "a key may appear once in a mapping"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def check_yaml_bounds(text: str, where: str, limits: Limits = CONFIG_LIMITS) -> None:
    """ConfigError when the YAML ``text`` (an override's value) exceeds ``limits``; text that
    is not valid YAML is left to the caller's parser (its grammar may differ)."""
    from cpkv.core.errors import ConfigError

    if len(text) > limits.max_bytes:
        raise ConfigError(f"{where}: larger than {_mib(limits.max_bytes)}; allowed: up to that")
    loader = _BoundedLoader(text, where, limits)
    try:
        while loader.check_node():
            loader.get_node()
    except _Refused as err:
        raise ConfigError(str(err).replace(f"{where}:1: ", f"{where}: ")) from None
    except (yaml.YAMLError, RecursionError):
        pass
    finally:
        loader.dispose()
