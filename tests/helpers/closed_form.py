"""A serving config whose capacity is known in closed form (capacity search tests).

One instance, a cost model of a fixed ``F`` per iteration and nothing per token, one request
per prefill batch (``prefill_max_requests: 1``), prompts of 4 tokens and ``max_new_tokens: 1``:
every iteration serves exactly one request (prefill, first token, finished), so the instance
serves ``R = 1 / F`` requests per second. Arrivals are evenly spaced, ``SPACING_MS`` apart at
speedup 1 (``N`` requests, the ``trace`` process), so at speedup ``s`` they come at
``lambda = s * 1000 / SPACING_MS`` per second.

Derivation of the attainment (request ``k`` from 0, ``T`` = the TTFT SLO):

* ``lambda <= R``: each request finds the instance idle (the previous one ended ``F`` after
  it arrived, no later than this arrival): TTFT = F for all; with T >= F all meet;
* ``lambda > R``: the instance never idles; request ``k`` starts at ``k F`` (iteration ``k``),
  arrived at ``k / lambda``, so TTFT_k = (k + 1) F - k / lambda = F + k (F - 1 / lambda). It
  meets T iff k (F - 1 / lambda) <= T - F.

With ``T = 1.5 F`` and ``N = 100``, attainment >= 90% iff request k = 89 meets:
89 (F - 1/lambda) <= 0.5 F  <=>  1/lambda >= F (1 - 1/178)  <=>  lambda <= R * 178 / 177.
So the true threshold is lambda* = R * 178/177 (0.565% above R), in speedup
s* = lambda* * SPACING_MS / 1000.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

F_US = 20_000.0  # 20 ms per iteration
R_RPS = 1e6 / F_US  # 50 requests/s
SPACING_MS = 10.0  # 100 requests/s at speedup 1: twice the capacity
N = 100
TTFT_SLO_MS = 1.5 * F_US / 1000.0  # 30 ms
THRESHOLD_RPS = R_RPS * 178 / 177
THRESHOLD_SPEEDUP = THRESHOLD_RPS * SPACING_MS / 1000.0  # 0.502825...


def attainment_pct(speedup: float) -> float:
    """The attainment derived above, counted request by request (an independent model)."""
    lam = speedup * 1000.0 / SPACING_MS
    f_s, t_s = F_US / 1e6, TTFT_SLO_MS / 1000.0
    if lam <= R_RPS:
        return 100.0
    met = sum(f_s + k * (f_s - 1 / lam) <= t_s + 1e-12 for k in range(N))
    return 100.0 * met / N


def write_config(folder: Path, extra: dict | None = None, requests: int = N) -> Path:
    """``folder/closed_form.yaml`` and its ``arrivals.jsonl`` (path relative to the config's
    folder: tests chdir there)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"rid": f"q{k}", "extend_tokens": 4, "max_new_tokens": 1,
                    "arrival_ms": SPACING_MS * k})
        for k in range(requests)
    ]  # fmt: skip
    (folder / "arrivals.jsonl").write_text("\n".join(lines) + "\n")
    doc = {
        "kind": "admit",
        "name": "closed-form",
        "seed": 0,
        "admit": {
            "policy": "prefill_adder",
            "mode": "serving",
            "workload": {"source": "jsonl", "path": str(folder / "arrivals.jsonl")},
            "prefill_max_requests": 1,
            "cp": {"enabled": False},
            "kv": {"block_size": 16, "capacity_blocks": 64},
            "arrivals": {"process": "trace", "speedup": 1.0},
            "cost": {"kind": "linear", "fixed_us": F_US, "prefill_token_us": 0, "decode_request_us": 0,
                     "context_token_us": 0, "l2_load_gb_per_s": None},
            "slo": {"ttft_ms": TTFT_SLO_MS},
        },
        **(extra or {}),
    }  # fmt: skip
    path = folder / "closed_form.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
