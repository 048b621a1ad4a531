"""How many prefill and decode instances to buy: the deployments a ``capacity.gpus`` search
tries, and the frontier of its answers.

With ``capacity.gpus: [n, ...]`` and a config holding a disaggregated deployment
(``admit.cluster.prefill`` and ``decode``: their routers, costs and KV pools), the second
axis is ``admit.cluster`` and its values are generated (:func:`deployment_axis`): for each
GPU count ``n``, every ``xPyD`` with ``x >= 1`` prefill and ``y >= 1`` decode instances whose
GPUs add up to ``n`` (an instance's GPUs are its pool's ``tp x pp``), and, with
``capacity.colocated`` (the default), ``n / g`` colocated instances behind the prefill
pool's router (``g``: ``admit.cost``'s GPUs per instance), when that divides.

The answers (:func:`frontier`): per GPU count the deployment with the highest capacity (the
best load for that many GPUs), and with ``capacity.target_load`` the deployment with the
fewest GPUs whose capacity reaches it (ties: the higher capacity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpkv.core.config import lookup
from cpkv.core.errors import ConfigError
from cpkv.sweep.grid import Axis

ORIGIN = "capacity.gpus"
AXIS_KEY = "admit.cluster"
DEFAULT_LINK = "{kind: infiniband, gb_per_s: null, latency_us: null}"


def _instance_gpus(resolved: Mapping[str, Any], pool: str | None) -> int:
    """GPUs of one instance: ``tp x pp`` of the pool's cost (null keys: ``admit.cost``'s);
    a linear cost model: 1."""
    cost = lookup(resolved, "admit.cost") or {}
    if cost.get("kind", "roofline") != "roofline":
        return 1
    own = (lookup(resolved, f"admit.cluster.{pool}.cost") or {}) if pool else {}
    tp = own.get("tp") or cost.get("tp") or 1
    pp = own.get("pp") or cost.get("pp") or 1
    return int(tp) * int(pp)


def deployment_axis(
    resolved: Mapping[str, Any], gpus: Sequence[int], colocated: bool, where: str
) -> Axis:
    """The ``admit.cluster`` values of a ``capacity.gpus`` search (module docstring)."""
    if lookup(resolved, "admit.cluster.prefill") is None:
        raise ConfigError(
            f"{where}: capacity.gpus searches prefill:decode splits, and the config holds no "
            "disaggregated deployment; give admit.cluster.prefill and admit.cluster.decode "
            "(their routers, costs and KV pools: each split keeps them)"
        )
    g_p, g_d = _instance_gpus(resolved, "prefill"), _instance_gpus(resolved, "decode")
    g = _instance_gpus(resolved, None)
    router = lookup(resolved, "admit.cluster.prefill.router")
    values = []
    for n in gpus:
        found = 0
        for x in range(1, n // g_p + 1):
            rest = n - x * g_p
            if rest >= g_d and rest % g_d == 0:
                y = rest // g_d
                values.append((f"{{prefill: {{instances: {x}}}, decode: {{instances: {y}}}}}",))
                found += 1
        if colocated and n % g == 0:
            values.append((
                f"{{instances: {n // g}, router: {router}, prefill: null, decode: null, "
                f"link: {DEFAULT_LINK}}}",
            ))  # fmt: skip
            found += 1
        if not found:
            raise ConfigError(
                f"{where}: capacity.gpus: {n} GPUs hold no deployment (a prefill instance takes "
                f"{g_p} GPUs, a decode instance {g_d}, a colocated one {g}); allowed: counts "
                f"of at least {g_p + g_d}"
            )
    return Axis((AXIS_KEY,), tuple(values), ORIGIN)


def deployment_of(resolved: Mapping[str, Any]) -> tuple[str, int]:
    """A config's deployment: its name (``3P1D``, ``4 colocated``) and its GPUs."""
    cluster = lookup(resolved, "admit.cluster") or {}
    prefill, decode = cluster.get("prefill"), cluster.get("decode")
    if prefill is not None and decode is not None:
        x, y = int(prefill.get("instances", 1)), int(decode.get("instances", 1))
        gpus = x * _instance_gpus(resolved, "prefill") + y * _instance_gpus(resolved, "decode")
        return f"{x}P{y}D", gpus
    n = int(cluster.get("instances", 1))
    return f"{n} colocated", n * _instance_gpus(resolved, None)


def frontier(searches: Sequence[Mapping[str, Any]], target_load: float | None) -> dict[str, Any]:
    """Per GPU count the deployment with the highest capacity; the cheapest deployment that
    reaches ``target_load`` (module docstring). ``searches``: capacity.json's, each with its
    ``deployment`` and ``gpus``."""
    best: dict[int, Mapping[str, Any]] = {}
    for s in searches:
        load, gpus = s.get("capacity_load"), s.get("gpus")
        if load is None or gpus is None:
            continue
        held = best.get(gpus)
        if held is None or load > held["capacity_load"]:
            best[gpus] = s
    rows = [
        {"gpus": gpus, "deployment": s["deployment"], "capacity_load": s["capacity_load"],
         "offered_requests_per_s": s.get("capacity_offered_requests_per_s"),
         "goodput_requests_per_s": s.get("capacity_goodput_requests_per_s")}
        for gpus, s in sorted(best.items())
    ]  # fmt: skip
    cheapest = None
    if target_load is not None:
        reaching = [
            s for s in searches
            if s.get("capacity_load") is not None and s["capacity_load"] >= target_load
            and s.get("gpus") is not None
        ]  # fmt: skip
        if reaching:
            s = min(reaching, key=lambda s: (s["gpus"], -s["capacity_load"]))
            cheapest = {"deployment": s["deployment"], "gpus": s["gpus"],
                        "capacity_load": s["capacity_load"]}  # fmt: skip
    return {"best_per_gpus": rows, "target_load": target_load, "cheapest": cheapest}
