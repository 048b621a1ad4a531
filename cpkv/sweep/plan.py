"""Plan a sweep: configs x grids -> validated points, with deterministic names and order.

Planning has no side effects: every point's config is loaded and validated (errors name
the config file and the override), nothing is written, nothing runs. Points are ordered by
config (command-line order), then by grid position (last swept key fastest).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cpkv.core.config import LoadedConfig, load_config, lookup, read_yaml
from cpkv.core.errors import ConfigError
from cpkv.core.kinds import KINDS, KindSpec
from cpkv.core.schema import build
from cpkv.runs.rundir import bounded
from cpkv.sweep.grid import COMMAND_LINE, Axis, axes_from_block, axes_from_overrides, expand

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]+")
NAME_LIMIT = 64  # a point directory's name, whatever is swept (bounded() keeps it apart)
SWEEP_NAME_LIMIT = 40  # the configs' names joined, before they become "<first>+N-more"


@dataclass(frozen=True)
class Point:
    """One run of a sweep: where it goes, what it runs, what was swept."""

    index: int
    name: str
    kind: str
    config_name: str
    source: str | None
    overrides: tuple[str, ...]
    swept: dict[str, Any]
    config: dict[str, Any]
    timed: bool

    def loaded(self) -> LoadedConfig:
        """The validated config, rebuilt from the resolved copy (no file needed)."""
        spec = KINDS.get(self.kind)
        return LoadedConfig(
            spec, build(spec.config_cls(), self.config), self.source, self.overrides
        )

    @property
    def match_key(self) -> tuple[str, str, str]:
        """What identifies the point across two sweeps: kind, config name, swept values."""
        swept = ",".join(f"{k}={self.swept[k]!r}" for k in sorted(self.swept))
        return (self.kind, self.config_name, swept)


@dataclass(frozen=True)
class SweepPlan:
    name: str
    configs: tuple[str, ...]
    overrides: tuple[str, ...]
    zips: tuple[str, ...]
    points: tuple[Point, ...]
    swept_keys: tuple[str, ...] = field(default=())


def plan_sweep(
    configs: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    zips: Sequence[str] = (),
    name: str | None = None,
) -> SweepPlan:
    """Expand every config's ``sweep:`` block and the command-line sweeps into points."""
    if not configs:
        raise ConfigError(
            f"cpkv sweep: name one or more config files (kinds: {', '.join(KINDS.names())})"
        )
    plain, cl_axes = axes_from_overrides(overrides, zips)
    used: set[str] = set()
    per_config = []
    for path in configs:
        kind = read_yaml(path).get("kind")
        mine = [o for o in plain if _applies(o, kind)]
        base = load_config(None, path, mine)
        axes = _merge_axes(
            axes_from_block(base.sweep.get("sweep"), str(path)), cl_axes, mine, base, str(path)
        )
        used.update(o.partition("=")[0].strip() for o in mine)
        used.update(k for ax in axes if ax.origin == COMMAND_LINE for k in ax.keys)
        per_config.append((str(path), base, mine, axes))
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key not in used:
            raise ConfigError(
                f"override {item!r}: no config of the sweep has key {key} (kinds: {', '.join(_kinds(per_config))})"
            )
    raw = [
        (path, base, mine, axes, pt) for path, base, mine, axes in per_config for pt in expand(axes)
    ]
    width = max(3, len(str(len(raw) - 1)))
    points, keys = [], {}
    for index, (path, base, mine, axes, pt) in enumerate(raw):
        try:
            points.append(_point(index, width, path, base, mine, pt))
        except ConfigError as err:
            raise _blame(err, axes, pt) from None
        keys.update(dict.fromkeys(pt))
    points = _names_per_config(points, width)
    sweep_name = name or sweep_name_of([base.experiment.name for _, base, _, _ in per_config])
    return SweepPlan(
        sweep_name,
        tuple(map(str, configs)),
        tuple(overrides),
        tuple(zips),
        tuple(points),
        tuple(keys),
    )


def sweep_name_of(config_names: Sequence[str]) -> str:
    """The configs' names joined with ``+`` when that is short; else ``<first>+<N>-more``."""
    names = list(dict.fromkeys(config_names))
    joined = "+".join(names)
    if len(joined) <= SWEEP_NAME_LIMIT or len(names) == 1:
        return joined
    return f"{names[0]}+{len(names) - 1}-more"


def _applies(override: str, kind: object) -> bool:
    """A key under another kind's block (``alloc_l1.x=..`` for an ``alloc_host`` config) is skipped."""
    head = override.partition("=")[0].strip().split(".")[0]
    blocks = {KINDS.get(k).block for k in KINDS.names()}
    own = KINDS.get(kind).block if isinstance(kind, str) and kind in KINDS else None
    return head not in blocks or head == own


def _merge_axes(
    file_axes: list[Axis], cl_axes: list[Axis], plain: list[str], base: LoadedConfig, path: str
) -> list[Axis]:
    """File axes, minus keys the command line fixes or re-sweeps, then the command-line axes."""
    taken = {o.partition("=")[0].strip() for o in plain}
    mine = [ax for ax in cl_axes if all(_applies(f"{k}=", base.spec.name) for k in ax.keys)]
    taken.update(k for ax in mine for k in ax.keys)
    kept = []
    for ax in file_axes:
        clash = [k for k in ax.keys if k in taken]
        if clash and len(ax.keys) > 1:
            raise ConfigError(
                f"{ax.where(clash[0])}: {clash[0]} moves in a zip: group; the command line cannot set it alone"
            )
        if not clash:
            kept.append(ax)
    return [_wrap_lists(ax, base.resolved) for ax in [*kept, *mine]]


def _wrap_lists(axis: Axis, resolved: Mapping[str, Any]) -> Axis:
    """A scalar swept on a list-valued key means a one-element list: ``host_pages=600`` -> ``[600]``."""
    is_list = [isinstance(lookup(resolved, k), list) for k in axis.keys]
    values = tuple(
        tuple(
            f"[{v}]" if lst and not v.lstrip().startswith("[") else v
            for v, lst in zip(pos, is_list, strict=True)
        )
        for pos in axis.values
    )
    return Axis(axis.keys, values, axis.origin, axis.at)


def _blame(err: ConfigError, axes: Sequence[Axis], pt: Mapping[str, str]) -> ConfigError:
    """An error of a value from a file's ``sweep:`` block, as ``file:line: sweep KEY=VALUE: ...``.

    Config loading names the override that carries a bad value (``override 'KEY=VALUE': ...``);
    a swept value's override comes from the file, so the error names the file and line instead.
    """
    text = str(err)
    for ax in axes:
        if ax.origin == COMMAND_LINE:
            continue  # the command line's own override is what the user typed: keep it
        for key in ax.keys:
            item = f"{key}={pt[key]}"
            prefix = f"override {item!r}: "
            if text.startswith(prefix):
                return ConfigError(f"{ax.where(key, pt[key])}: sweep {item}: {text[len(prefix) :]}")
    return err


def _point(
    index: int, width: int, path: str, base: LoadedConfig, plain: list[str], pt: dict[str, str]
) -> Point:
    overrides = (*plain, *(f"{k}={v}" for k, v in pt.items()))
    loaded = load_config(None, path, overrides)
    loaded.spec.check_memory(loaded.experiment)  # a point that cannot fit: refused up front
    resolved = loaded.resolved
    swept = {k: lookup(resolved, k) for k in pt}
    return Point(
        index=index,
        name=point_name(index, width, loaded.experiment.name, swept),
        kind=loaded.spec.name,
        config_name=loaded.experiment.name,
        source=path,
        overrides=tuple(overrides),
        swept=swept,
        config=resolved,
        timed=is_timed(loaded.spec, loaded.experiment),
    )


def _names_per_config(points: list[Point], width: int) -> list[Point]:
    """Every point of a config named alike: with its keys when every name fits NAME_LIMIT,
    else with the values alone (:func:`point_name`)."""
    long_sources = {
        p.source
        for p in points
        if len(_full_name(p.index, width, p.config_name, p.swept, keyed=True)) > NAME_LIMIT
    }
    return [
        p
        if p.source not in long_sources
        else replace(p, name=point_name(p.index, width, p.config_name, p.swept, keyed=False))
        for p in points
    ]


def point_name(
    index: int, width: int, config_name: str, swept: Mapping[str, Any], *, keyed: bool = True
) -> str:
    """``007_host-small_protocol=warm_request_pages=8+64``; without ``keyed``, the values
    alone (``007_host-small_warm_8+64``; the sweep's summary names the keys). At most
    NAME_LIMIT characters: a longer name keeps its start and a hash of the whole
    (:func:`cpkv.runs.rundir.bounded`)."""
    return bounded(_full_name(index, width, config_name, swept, keyed=keyed), NAME_LIMIT)


def _full_name(
    index: int, width: int, config_name: str, swept: Mapping[str, Any], *, keyed: bool
) -> str:
    head = [f"{index:0{width}d}", config_name]
    values = [
        "+".join(map(_yaml_word, v)) if isinstance(v, list) else _yaml_word(v)
        for v in swept.values()
    ]
    if keyed:
        values = [f"{k.split('.')[-1]}={v}" for k, v in zip(swept, values, strict=True)]
    return _UNSAFE.sub("-", "_".join([*head, *values])).rstrip("-_")


def _yaml_word(value: Any) -> str:
    """A value as a config file spells it: null, true, false, numbers and strings as they are."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def is_timed(spec: KindSpec, experiment: Any) -> bool:
    """Whether a kind times things (its points must not share cores with other points)."""
    return spec.timed


def _kinds(per_config: Sequence[tuple[str, LoadedConfig, Any, Any]]) -> list[str]:
    return list(dict.fromkeys(base.spec.name for _, base, _, _ in per_config))
