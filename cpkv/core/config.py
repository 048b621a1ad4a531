"""Configs: YAML file + OmegaConf dotlist overrides -> a typed, frozen dataclass.

The only module that imports OmegaConf. Every error names the file (and line, when
the key is in the file) or the override it came from, the key, and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpkv.core.errors import ConfigError
from cpkv.core.files.yaml_input import CONFIG_LIMITS, check_yaml_bounds, read_yaml_file
from cpkv.core.kinds import KINDS, KindSpec
from cpkv.core.schema import FieldError, build, to_dict
from cpkv.core.suggest import did_you_mean

# Top-level keys that configure several runs rather than one: ``sweep:`` (read by cpkv sweep
# and, as its second axis, by cpkv capacity) and ``capacity:`` (a capacity search's settings,
# read by cpkv capacity; cpkv sweep runs such a file's sweep: points at its own load).
SWEEP_KEYS = ("sweep", "capacity")
RUNNERS = {"sweep": "cpkv sweep", "capacity": "cpkv capacity"}
_ABSENT = object()


@dataclass(frozen=True)
class LoadedConfig:
    """A validated experiment config and where it came from."""

    spec: KindSpec
    experiment: Any
    source: str | None
    overrides: tuple[str, ...]
    sweep: Mapping[str, Any] = field(default_factory=dict)

    @property
    def resolved(self) -> dict[str, Any]:
        return to_dict(self.experiment)

    def to_yaml(self) -> str:
        return dump_yaml(self.resolved)


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file into a plain dict: one line naming the file (and line) for a missing,
    unreadable, too large, non-UTF-8 or invalid file, a repeated key, deep nesting or aliases
    that expand too far (:mod:`cpkv.core.files.yaml_input`)."""
    p = Path(path)
    if p.is_dir() and (p / "config.yaml").is_file():
        raise ConfigError(f"{path}: is a run directory; re-run its config with {p / 'config.yaml'}")
    data = read_yaml_file(path, ConfigError, CONFIG_LIMITS, what="config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


_KEY_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\[\d+\])*")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
_PLAIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_PLAIN_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.[0-9]+")
_YAML_WORDS = frozenset(
    "yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF "
    "null Null NULL".split()
)
"""The words YAML 1.1 reads as a boolean or null (PyYAML's resolvers, OmegaConf's loader)."""
_INTERPOLATION = re.compile(r"\$\{(?P<key>[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*)\}")


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """OmegaConf dotlist (``a.b=1``, ``a.l=[1,2]``) -> nested plain dict.

    Every error quotes the override as typed: no ``=``, a malformed key (``a..b``), a value
    that is not valid YAML or exceeds the bounds of a config file (nesting, aliases)."""
    merged: dict[str, Any] = {}
    for item in overrides:
        key, eq, value = item.partition("=")
        shown = _quote(item)
        if not eq or not key.strip():
            raise ConfigError(
                f"override {shown}: expected KEY=VALUE (for example alloc_host.page_size=16)"
            )
        if not all(_KEY_PART.fullmatch(part) for part in key.strip().split(".")):
            raise ConfigError(
                f"override {shown}: malformed key {key.strip()!r}; allowed: dotted names such "
                "as admit.page_size (letters, digits, _ and -, no empty part)"
            )
        check_yaml_bounds(value, f"override {shown}")
        part = _plain_override(key, value)
        if part is None:
            part = _omegaconf_override(item, shown)
        merged = _merge_plain(merged, part)
    return merged


def _plain_override(key: str, value: str) -> dict[str, Any] | None:
    """``key=value`` as OmegaConf's dotlist reads it, for a dotted key of plain names and a
    value that is a word (not one YAML reads as a boolean or null), a decimal integer or a
    plain decimal number; None for anything else (OmegaConf reads it: its import alone
    takes tens of milliseconds)."""
    if not _PLAIN_KEY.fullmatch(key):
        return None
    parsed: Any
    if _PLAIN_WORD.fullmatch(value) and value not in _YAML_WORDS:
        parsed = value
    elif _PLAIN_INT.fullmatch(value):
        parsed = int(value)
    elif _PLAIN_DECIMAL.fullmatch(value):
        parsed = float(value)
    else:
        return None
    for part in reversed(key.split(".")):
        parsed = {part: parsed}
    return parsed


def _omegaconf_override(item: str, shown: str) -> dict[str, Any]:
    """One override read by OmegaConf's dotlist."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        conf = OmegaConf.from_dotlist([item])
        return OmegaConf.to_container(conf, resolve=False)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as err:
        problem = getattr(err, "problem", None) or _first_line(err)  # YAML errors: the problem
        raise ConfigError(f"override {shown}: {problem}") from None


def _quote(item: str, limit: int = 120) -> str:
    """``item`` quoted as in an error message, cut to ``limit`` characters."""
    return repr(item) if len(item) <= limit else repr(item[: limit - 3] + "...")


def _merge_plain(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` merged into ``base`` recursively (mappings merged, anything else replaced)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_plain(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    kind: str | None,
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    command: str | None = None,
) -> LoadedConfig:
    """Load the built-in default for ``kind`` (or the file's kind), merge file and overrides, validate."""
    file_data = read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else None
    file_kind = file_data.get("kind")
    if file_kind is not None and not isinstance(file_kind, str):
        raise ConfigError(
            f"{source}: kind: expected a string (allowed: {', '.join(KINDS.names())})"
        )
    if kind is None:
        if file_kind is None:
            raise ConfigError(
                f"{source or 'config'}: kind: missing (allowed: {', '.join(KINDS.names())})"
            )
        kind = file_kind
    if kind not in KINDS:
        raise ConfigError(
            f"{source or 'config'}: kind: unknown kind {kind!r}{did_you_mean(kind, KINDS.names())} "
            f"(allowed: {', '.join(KINDS.names())})"
        )
    spec = KINDS.get(kind)
    if file_kind is not None and file_kind != kind:
        runner = command or spec.command
        other = f" (run it with `{KINDS.get(file_kind).command}`)" if file_kind in KINDS else ""
        raise ConfigError(
            f"{source}: kind is {file_kind!r}, but `{runner}` runs kind {kind!r}{other}"
        )
    sweep = {k: file_data.pop(k) for k in SWEEP_KEYS if k in file_data}
    if sweep and command is not None:
        block = "capacity" if "capacity" in sweep else "sweep"
        line = yaml_line(path, [block]) if path is not None else None
        raise ConfigError(
            f"{source}{':' + str(line) if line else ''}: holds a {block}: block, and `{command}` "
            f"runs one config; run it with `{RUNNERS[block]} {source}`"
        )
    override_data = parse_overrides(overrides)
    if "kind" in override_data and override_data["kind"] != kind:
        runner = command or spec.command
        raise ConfigError(
            f"override 'kind={override_data['kind']}': `{runner}` runs kind {kind!r}; "
            f"allowed: {kind} (a config of another kind runs with its own command)"
        )
    for k in SWEEP_KEYS:
        if k in override_data:
            hint = (
                "`cpkv sweep KEY=a,b`"
                if k == "sweep"
                else "`cpkv capacity CONFIG capacity.KEY=VALUE`"
            )
            raise ConfigError(f"override {k}=...: {k} keys belong in a config file or {hint}")
    defaults = to_dict(spec.config_cls()())
    inside = _value_under_overrides(file_data, override_data)
    if inside is not None:  # an override sets a key inside what the file made a value
        key, value = inside
        err = FieldError(key, f"expected a mapping, got {value!r} ({type(value).__name__})")
        raise ConfigError(_locate(err, path, file_data, ()))
    try:  # the defaults, then the file, then the overrides; the result is what is validated
        merged = _merge(defaults, file_data, override_data, source)
        merged["kind"] = kind
        experiment = build(spec.config_cls(), merged)
        check_seed(getattr(experiment, "seed", 0))
    except FieldError as err:
        raise ConfigError(_locate(err, path, file_data, overrides)) from None
    return LoadedConfig(spec, experiment, source, tuple(overrides), sweep)


SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch and numpy generators take


def check_seed(seed: int) -> None:
    """FieldError unless ``seed`` fits the random generators (a signed 64-bit integer)."""
    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise FieldError("seed", f"{seed} does not fit 64 bits; allowed: {low}..{high}")


def _merge(defaults: dict, file_data: dict, override_data: dict, source: str | None) -> dict:
    if _plain(file_data) and _plain(override_data):  # what OmegaConf would merge as it is
        return _merge_plain(_merge_plain(defaults, file_data), override_data)
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(
            OmegaConf.create(defaults), OmegaConf.create(file_data), OmegaConf.create(override_data)
        )
        check_interpolations(OmegaConf.to_container(merged, resolve=False))
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError, TypeError) as err:
        key = getattr(err, "full_key", None)
        where = source or "overrides"
        raise ConfigError(f"{where}: {key + ': ' if key else ''}{_first_line(err)}") from None


def _value_under_overrides(
    file_data: Mapping, override_data: Mapping, at: str = ""
) -> tuple[str, Any] | None:
    """``(key, value)`` of a value (not a mapping, not null) in the file at a key an override
    sets keys inside, else None."""
    for key, value in override_data.items():
        if not isinstance(value, Mapping) or key not in file_data:
            continue
        dotted = f"{at}.{key}" if at else str(key)
        held = file_data[key]
        if isinstance(held, Mapping):
            found = _value_under_overrides(held, value, dotted)
            if found is not None:
                return found
        elif held is not None:
            return dotted, held
    return None


_PLAIN_VALUES = (str, int, float, bool, type(None))


def _plain(tree: Any) -> bool:
    """Whether ``tree`` holds only string keys, mappings, lists and plain values, and no
    interpolation (``${``): merging it needs nothing of OmegaConf's."""
    if isinstance(tree, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in tree.items())
    if isinstance(tree, list):
        return all(_plain(v) for v in tree)
    if isinstance(tree, str):
        return "${" not in tree
    return isinstance(tree, _PLAIN_VALUES)


def check_interpolations(tree: Any, at: str = "", root: Any = None) -> None:
    """FieldError for an OmegaConf interpolation other than a whole ``${dotted.key}`` that
    names a key holding one value (a number, a string, true/false or null).

    Resolving an interpolation copies what it names, so interpolations of lists can grow a
    config exponentially (an *interpolation bomb*), and resolvers (``${oc.env:...}``) make a
    config depend on the environment; both are refused before OmegaConf resolves anything.
    """
    root = tree if root is None else root
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            check_interpolations(value, f"{at}.{key}" if at else str(key), root)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            check_interpolations(value, f"{at}[{i}]", root)
    elif isinstance(tree, str) and "${" in tree:
        seen = [at]
        value = tree
        while isinstance(value, str) and "${" in value:
            m = _INTERPOLATION.fullmatch(value)
            target = lookup(root, m.group("key"), _ABSENT) if m else _ABSENT
            if m is None or isinstance(target, Mapping | list) or m.group("key") in seen:
                raise FieldError(
                    at,
                    f"interpolation {_quote(tree, 60)} is not allowed; allowed: a whole value "
                    "${dotted.key} naming a key that holds one number, string, true/false or null",
                )
            if target is _ABSENT:
                return  # OmegaConf names the missing key
            seen.append(m.group("key"))
            value = target


def _locate(
    err: FieldError, path: str | Path | None, file_data: dict, overrides: Sequence[str]
) -> str:
    """Prefix a field error with the override or file:line it came from."""
    key = err.key
    base = key.split("[")[0]
    for item in overrides:
        okey, _, value = item.partition("=")
        okey = okey.strip()
        if okey == base or base.startswith(okey + ".") or okey.startswith(base + "."):
            hint = ""
            if "," in value and not value.strip().startswith(("[", "{")):
                hint = " (a list is written [a,b]; to sweep values use `cpkv sweep ... KEY=a,b`)"
            return f"override {_quote(item)}: {err}{hint}"
    if path is not None and lookup(file_data, base, _ABSENT) is not _ABSENT:
        line = yaml_line(path, base.split("."))
        return f"{path}{':' + str(line) if line else ''}: {err}"
    prefix = f"{path}: " if path is not None else ""
    return f"{prefix}{err}"


def lookup(data: Any, dotted: str, default: Any = None) -> Any:
    """The value at dotted key ``a.b.c`` of nested mappings, or ``default`` when absent."""
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return default
        data = data[part]
    return data


def yaml_line(path: str | Path, at: Sequence[str | int]) -> int | None:
    """1-based line of the node at ``at`` in a YAML file: mapping keys (taken whole, dots and
    all) and list indexes; the deepest one found; None when the file cannot be read."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for step in at:
        if isinstance(node, yaml.MappingNode) and isinstance(step, str):
            found = [(k, v) for k, v in node.value if getattr(k, "value", None) == step]
            if not found:
                break
            key, node = found[-1]  # a repeated key: YAML keeps the last one
            line = key.start_mark.line + 1
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value)
        ):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
