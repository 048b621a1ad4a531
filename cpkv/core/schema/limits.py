"""Physical limits that config keys and input fields are bounded by, each with its reason.

* **The clock.** The serving simulation keeps time in microseconds in a float64: below
  ``2**53`` µs (about 285 years) consecutive floats are at most 1 µs apart, beyond it they are
  2 µs or more apart and an iteration's duration rounds away (a TTFT of milliseconds reads
  0). Every time a run reaches (an arrival, a deadline, the run's end) must stay below
  :data:`CLOCK_LIMIT_US`; a time shorter than the clock's 1 µs resolution
  (:data:`CLOCK_RESOLUTION_MS`) cannot be told apart from 0.
* **Tokens.** SGLang indexes KV slots and token positions with int32 (its
  ``req_to_token`` table): a count of tokens (a prompt, an output, a budget, a pool) is at
  most :data:`MAX_TOKENS`, 200 times the longest context any model serves (10M tokens).
* **Integers in files.** Fields that cpkv packs into 64-bit records (priorities, block
  hashes) stay within int64.

The ``Annotated`` aliases below put these bounds next to a key's type
(:class:`cpkv.core.schema.Range`); schemas with bounds of their own build them the same way.
"""

from __future__ import annotations

import math
from typing import Annotated

from cpkv.core.schema.fields import Range

CLOCK_LIMIT_US = float(2**53)
"""The float64 microsecond clock resolves 1 µs below this time (about 285 years)."""
CLOCK_LIMIT_MS = CLOCK_LIMIT_US / 1e3
CLOCK_LIMIT_S = CLOCK_LIMIT_US / 1e6
CLOCK_RESOLUTION_MS = 1e-3
"""1 µs, the resolution the reports need (they print milliseconds to 1e-6)."""
CLOCK_WHY = "2**53 µs, about 285 years: beyond it the float64 µs clock cannot resolve 1 µs"
RESOLUTION_WHY = "1 µs, the simulation clock's resolution"

MAX_TOKENS = 2**31 - 1
TOKENS_WHY = "int32, SGLang's token index; 200x the longest context any model serves"
INT64_MAX = 2**63 - 1
INT64_WHY = "a 64-bit integer"

Tokens = Annotated[int, Range(0, MAX_TOKENS, why=TOKENS_WHY)]
"""A count of tokens, 0 allowed."""
Milliseconds = Annotated[
    float,
    Range(CLOCK_RESOLUTION_MS, CLOCK_LIMIT_MS, why=CLOCK_WHY, low_why=RESOLUTION_WHY),
]
"""A duration the simulation clock can resolve, in milliseconds."""
Microseconds = Annotated[float, Range(0, CLOCK_LIMIT_US, why=CLOCK_WHY)]
"""A time cost in microseconds (0 allowed: free)."""


def token_field_problem(value: object, low: int = 0) -> str | None:
    """Why a token count read from a file is not one (``must be an integer >= 1``, ``must be
    an integer <= 2147483647 (...)``), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"must be an integer >= {low}"
    if value > MAX_TOKENS:
        return f"must be an integer <= {MAX_TOKENS} ({TOKENS_WHY})"
    return None


def time_field_problem(
    value: object, unit_ms: float = 1.0, unit: str = "milliseconds"
) -> str | None:
    """Why a time read from a file (``value``, in units of ``unit_ms`` milliseconds) is not a
    finite time >= 0 that the clock resolves, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        return f"must be a finite number of {unit} >= 0"  # NaN fails both comparisons
    limit = CLOCK_LIMIT_MS / unit_ms
    if value > limit:
        return f"must be at most {limit:.6g} {unit} ({CLOCK_WHY})"
    return None
