"""Plan a capacity search: the config checked, the load key, the second axis, the settings.

Planning has no side effects and raises every user error (one line, naming the file and line,
the override or the flag) before a search directory exists:

* the config must be kind ``admit`` with ``admit.mode: serving``, an SLO (``admit.slo.ttft_ms``
  or ``tpot_ms``) and arrivals that have a load: ``poisson`` (the load is
  ``admit.arrivals.rate_rps``) or ``trace`` (``admit.arrivals.speedup``);
* the settings are the config file's ``capacity:`` block, then ``capacity.KEY=VALUE`` overrides,
  then the command's flags (:class:`CapacitySpec`);
* at most one second axis: one key swept by the file's ``sweep:`` block or by a ``KEY=a,b``
  override (the command line wins), never the load key itself;
* ``max_requests`` caps every point's workload (``admit.workload.limit`` for a trace,
  ``admit.workload.synthetic.count`` for the synthetic source).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpkv.capacity.bracket import MIN_TOLERANCE, round_load
from cpkv.core.config import LoadedConfig, load_config, lookup, yaml_line
from cpkv.core.errors import ConfigError
from cpkv.core.kinds import KINDS
from cpkv.core.schema import FieldError, build, positive, require, to_dict
from cpkv.sweep.grid import COMMAND_LINE, Axis, axes_from_block, axes_from_overrides
from cpkv.sweep.plan import Point, point_name

KIND = "admit"
BLOCK = "capacity"
LOAD_KEYS = {"poisson": "admit.arrivals.rate_rps", "trace": "admit.arrivals.speedup"}
"""The load a search varies, by ``admit.arrivals.process``."""
POINT_INDEX_WIDTH = 3
MAX_POINTS_LIMIT = 200
MAX_GPUS = 4096


@dataclass(frozen=True)
class CapacitySpec:
    """A search's settings (the ``capacity:`` block of a config file, or the flags).

    * ``attainment``: the target, a fraction of all requests that meet ``admit.slo`` (0.9: 90%);
    * ``tolerance``: the relative width of the final bracket (0.02: the capacity is known to 2%);
    * ``growth``: the factor between loads while bracketing;
    * ``start``: the first load (null: the config's own ``rate_rps`` or ``speedup``);
    * ``max_requests``: the most requests a point serves (null: the whole workload);
    * ``max_points``: the most points per search (per value of the second axis);
    * ``gpus``: GPU counts whose prefill:decode splits (and, with ``colocated``, colocated
      instances) the search tries, the second axis generated from them
      (:mod:`cpkv.capacity.deployments`); ``target_load``: the load whose cheapest deployment
      the result names (null: none).
    """

    attainment: float = 0.9
    tolerance: float = 0.02
    growth: float = 2.0
    start: float | None = None
    max_requests: int | None = None
    max_points: int = 30
    gpus: tuple[int, ...] = ()
    colocated: bool = True
    target_load: float | None = None

    def validate(self) -> None:
        require(
            0 < self.attainment <= 1,
            "attainment",
            f"must be a fraction in (0, 1] (0.9 for 90% of requests), got {self.attainment}",
        )
        require(
            MIN_TOLERANCE <= self.tolerance <= 1,
            "tolerance",
            f"must be a relative width in [{MIN_TOLERANCE}, 1] (0.02 for 2%), got {self.tolerance}",
        )
        require(1 < self.growth <= 1000, "growth", f"must be in (1, 1000], got {self.growth}")
        positive("start", self.start, allow_none=True)
        if self.start is not None:
            require(self.start < 1e12, "start", f"must be < 1e12, got {self.start}")
        positive("max_requests", self.max_requests, allow_none=True)
        require(
            1 <= self.max_points <= MAX_POINTS_LIMIT,
            "max_points",
            f"must be in [1, {MAX_POINTS_LIMIT}], got {self.max_points}",
        )
        require(
            all(1 <= n <= MAX_GPUS for n in self.gpus)
            and list(self.gpus) == sorted(set(self.gpus)),
            "gpus",
            f"must be GPU counts in [1, {MAX_GPUS}] in increasing order, got {list(self.gpus)}",
        )
        positive("target_load", self.target_load, allow_none=True)
        if self.target_load is not None:
            require(
                self.target_load < 1e12, "target_load", f"must be < 1e12, got {self.target_load}"
            )


@dataclass(frozen=True)
class AxisValue:
    """One value of the second axis (or the only search, without one): its overrides and its
    resolved config at the start load."""

    label: str
    value: Any
    overrides: tuple[str, ...]
    config: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class SearchPlan:
    """Everything a search needs, written to ``capacity.yaml`` (a resume reads it back)."""

    name: str
    config_path: str | None
    config_name: str
    overrides: tuple[str, ...]
    load_key: str
    axis_key: str | None
    values: tuple[AxisValue, ...]
    spec: CapacitySpec
    start: float
    slo: dict[str, Any]

    @property
    def load_label(self) -> str:
        return self.load_key.split(".")[-1]

    @property
    def axis_label(self) -> str | None:
        return None if self.axis_key is None else self.axis_key.split(".")[-1]

    def point(self, index: int, value_index: int, load: float) -> Point:
        """The sweep point that runs axis value ``value_index`` at ``load``."""
        av = self.values[value_index]
        config = copy.deepcopy(av.config)
        *parents, leaf = self.load_key.split(".")
        holder = config
        for part in parents:
            holder = holder[part]
        holder[leaf] = load
        build(KINDS.get(KIND).config_cls(), config)  # a load the schema refuses fails here
        swept = {} if self.axis_key is None else {self.axis_key: av.value}
        swept[self.load_key] = load
        return Point(
            index=index,
            name=point_name(index, POINT_INDEX_WIDTH, self.config_name, swept),
            kind=KIND,
            config_name=self.config_name,
            source=self.config_path,
            overrides=(*av.overrides, f"{self.load_key}={load}"),
            swept=swept,
            config=config,
            timed=False,
        )

    def value_index(self, point: Point) -> int | None:
        """Which axis value ``point`` (read back from a plan) belongs to; None when none."""
        if self.axis_key is None:
            return 0 if len(self.values) == 1 else None
        shown = _canon(point.swept.get(self.axis_key))
        for i, av in enumerate(self.values):
            if _canon(av.value) == shown:
                return i
        return None


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def split_capacity_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(``capacity.KEY=VALUE`` items, the config's own overrides)."""
    mine = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] == BLOCK]
    return mine, [o for o in overrides if o not in mine]


def plan_search(
    config_path: str | None,
    overrides: Sequence[str] = (),
    flags: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> SearchPlan:
    """Check the config, the settings and the second axis (see the module docstring)."""
    spec_items, own = split_capacity_overrides(overrides)
    plain, cl_axes = axes_from_overrides(own)
    base = load_config(None if config_path else KIND, config_path, plain)
    where = config_path or "config"
    if base.spec.name != KIND:
        raise ConfigError(
            f"{where}: kind is {base.spec.name!r}; cpkv capacity searches kind admit configs "
            "(admit.mode serving, with admit.slo set)"
        )
    spec = _spec(base, config_path, spec_items, flags or {})
    load_key = _check_serving(base.resolved, where)
    axis = _axis(base, config_path, cl_axes, plain, load_key)
    if spec.gpus:
        from cpkv.capacity.deployments import deployment_axis

        if axis is not None:
            raise ConfigError(
                f"{where}: capacity.gpus generates the second axis (admit.cluster: each "
                f"deployment of those GPUs); drop the other axis ({axis.keys[0]}) or capacity.gpus"
            )
        axis = deployment_axis(base.resolved, spec.gpus, spec.colocated, where)
    limit = _limit_override(base.resolved, spec.max_requests, where)
    values = []
    for text in axis.values if axis is not None else [(None,)]:
        values.append(_axis_value(config_path, plain, limit, axis, text[0], where, load_key))
    if spec.gpus:  # each generated value by its deployment's name (3P1D, 4 colocated)
        from dataclasses import replace

        from cpkv.capacity.deployments import deployment_of

        values = [replace(av, label=deployment_of(av.config)[0]) for av in values]
    start = spec.start if spec.start is not None else lookup(base.resolved, load_key)
    return SearchPlan(
        name=name or base.experiment.name,
        config_path=config_path,
        config_name=base.experiment.name,
        overrides=tuple(overrides),
        load_key=load_key,
        axis_key=axis.keys[0] if axis is not None else None,
        values=tuple(values),
        spec=spec,
        start=round_load(float(start)),
        slo=dict(lookup(base.resolved, "admit.slo")),
    )


def _spec(
    base: LoadedConfig, path: str | None, items: Sequence[str], flags: Mapping[str, Any]
) -> CapacitySpec:
    """The file's capacity: block, then capacity.KEY=VALUE overrides, then the flags."""
    from cpkv.core.config import parse_overrides

    block = base.sweep.get(BLOCK)
    if block is not None and not isinstance(block, Mapping):
        line = yaml_line(path, [BLOCK]) if path else None
        raise ConfigError(
            f"{path}{':' + str(line) if line else ''}: capacity: expected a mapping of settings "
            f"(allowed: {', '.join(to_dict(CapacitySpec()))})"
        )
    try:
        build(CapacitySpec, dict(block or {}))
    except FieldError as err:
        line = yaml_line(path, [BLOCK, err.key.split(".")[0]]) if path else None
        raise ConfigError(f"{path}{':' + str(line) if line else ''}: capacity.{err}") from None
    merged = {**(block or {})}
    for item in items:
        part = parse_overrides([item]).get(BLOCK)
        if not isinstance(part, Mapping):
            raise ConfigError(f"override {item!r}: expected capacity.KEY=VALUE")
        try:
            build(CapacitySpec, {**merged, **part})
        except FieldError as err:
            raise ConfigError(f"override {item!r}: capacity.{err}") from None
        merged.update(part)
    for key, value in flags.items():
        if value is None:
            continue
        try:
            build(CapacitySpec, {**merged, key: value})
        except FieldError as err:
            raise ConfigError(f"--{key.replace('_', '-')} {value}: {err.detail}") from None
        merged[key] = value
    return build(CapacitySpec, merged)


def _check_serving(resolved: Mapping[str, Any], where: str) -> str:
    """The load key; ConfigError naming what is missing for a capacity search."""
    mode = lookup(resolved, "admit.mode")
    if mode != "serving":
        raise ConfigError(
            f"{where}: admit.mode is {mode!r}; cpkv capacity needs admit.mode serving (it searches "
            "the load at which the serving run's SLO attainment holds)"
        )
    slo = lookup(resolved, "admit.slo") or {}
    if slo.get("ttft_ms") is None and slo.get("tpot_ms") is None:
        raise ConfigError(
            f"{where}: admit.slo sets no limit; cpkv capacity needs admit.slo.ttft_ms or "
            "admit.slo.tpot_ms (attainment = requests within the SLO / all requests)"
        )
    process = lookup(resolved, "admit.arrivals.process")
    if process not in LOAD_KEYS:
        raise ConfigError(
            f"{where}: admit.arrivals.process is {process!r} (every request at time 0): no load "
            "to search; allowed: poisson (the load is admit.arrivals.rate_rps) or trace "
            "(admit.arrivals.speedup)"
        )
    return LOAD_KEYS[process]


def _axis(
    base: LoadedConfig,
    path: str | None,
    cl_axes: list[Axis],
    plain: list[str],
    load_key: str,
) -> Axis | None:
    """The second axis: the file's sweep: block or a KEY=a,b override (the command line wins);
    at most one key."""
    file_axes = axes_from_block(base.sweep.get("sweep"), str(path)) if path else []
    taken = {o.partition("=")[0].strip() for o in plain} | {k for a in cl_axes for k in a.keys}
    axes = [a for a in file_axes if not set(a.keys) & taken] + cl_axes
    if not axes:
        return None
    keys = [k for a in axes for k in a.keys]
    if len(keys) > 1:
        origin = "the command line" if all(a.origin == COMMAND_LINE for a in axes) else path
        raise ConfigError(
            f"{origin}: cpkv capacity takes one second axis (one key with a list of values); "
            f"got {', '.join(keys)}"
        )
    axis = axes[0]
    if axis.keys[0] == load_key:
        raise ConfigError(
            f"{axis.where(load_key) if axis.origin != COMMAND_LINE else 'the command line'}: "
            f"{load_key} is the load the search varies; it cannot be the second axis "
            "(set the first load with capacity.start or --start)"
        )
    return axis


def _limit_override(
    resolved: Mapping[str, Any], max_requests: int | None, where: str
) -> str | None:
    """The override that caps a point's workload at ``max_requests`` (None: no cap needed)."""
    if max_requests is None:
        return None
    source = lookup(resolved, "admit.workload.source")
    if source == "trace":
        limit = lookup(resolved, "admit.workload.limit")
        if limit is not None and limit <= max_requests:
            return None
        return f"admit.workload.limit={max_requests}"
    if source == "synthetic":
        count = lookup(resolved, "admit.workload.synthetic.count")
        return None if count <= max_requests else f"admit.workload.synthetic.count={max_requests}"
    raise ConfigError(
        f"{where}: max_requests caps a trace (admit.workload.limit) or the synthetic source "
        f"(admit.workload.synthetic.count); admit.workload.source is {source!r} (leave "
        "max_requests null, or shorten the workload itself)"
    )


def _axis_value(
    path: str | None,
    plain: list[str],
    limit: str | None,
    axis: Axis | None,
    text: str | None,
    where: str,
    load_key: str,
) -> AxisValue:
    overrides = list(plain)
    if limit is not None:
        overrides.append(limit)
    if axis is not None:
        overrides.append(f"{axis.keys[0]}={text}")
    try:
        loaded = load_config(None if path else KIND, path, overrides)
    except ConfigError as err:
        if axis is None or axis.origin == COMMAND_LINE:
            raise  # the error names the override as typed
        item = f"{axis.keys[0]}={text}"
        detail = str(err).removeprefix(f"override {item!r}: ")
        raise ConfigError(f"{axis.where(axis.keys[0], text)}: sweep {item}: {detail}") from None
    resolved = loaded.resolved
    if (
        axis is not None
        and _check_serving(resolved, f"{where} with {axis.keys[0]}={text}") != load_key
    ):
        raise ConfigError(
            f"{where}: second axis {axis.keys[0]}={text} changes the load the search varies "
            f"(from {load_key}); every value of the second axis must keep admit.arrivals.process"
        )
    value = lookup(resolved, axis.keys[0]) if axis is not None else None
    label = text if text is not None else "-"
    return AxisValue(label, value, tuple(overrides), resolved)
