"""One published measurement and the configuration that reproduces it: a file of
``configs/validation/``.

A case is a static batch — ``batch`` requests of ``prompt_tokens`` each, prefilled together
in one iteration, then decoding together until each has ``output_tokens`` (the first comes
from the prefill), as the engines' own latency and throughput benchmarks run it (vLLM's
``benchmark_latency``, TensorRT-LLM's ``gptSessionBenchmark``, gpt-fast's ``generate.py``) —
priced by the ``cost`` block (``admit.cost``'s keys; its ``cpu.engine`` says which engine's
CPU work and all-reduce apply, ``none`` for a compiled loop). ``published`` holds the numbers
the source reports, by metric (:data:`METRICS`); ``source`` says where (URL, table) and
``setup`` what ran (hardware, engine and version, flags), both required: a number without its
source is not a validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from cpkv.core.errors import ConfigError
from cpkv.core.files.yaml_input import CONFIG_LIMITS, read_yaml_file
from cpkv.core.schema import FieldError, Range, build, choices, require
from cpkv.core.schema.limits import MAX_TOKENS, TOKENS_WHY
from cpkv.serving.cost.spec import CostSpec

METRICS = {
    "ttft_ms": "time to the first token: the prefill iteration, ms",
    "tpot_ms": "time per output token after the first: the mean decode iteration, ms",
    "latency_ms": "the whole batch, prefill and every decode iteration, ms",
    "output_tokens_per_s": "output tokens of the batch over its latency, per second",
    "output_tokens_per_s_per_gpu": "the same, per GPU (tp x pp)",
}
"""What a case may publish (each computed by :mod:`cpkv.validate.predict`)."""
MAX_BATCH = 1 << 16
Tokens = Annotated[int, Range(1, MAX_TOKENS, why=TOKENS_WHY)]
Positive = Annotated[float, Range(0, 1e12, low_open=True, why="a measured time or rate")]


@dataclass(frozen=True)
class ValidationCase:
    """One file of ``configs/validation/`` (module docstring)."""

    name: str = ""
    source: str = ""
    setup: str = ""
    batch: Annotated[int, Range(1, MAX_BATCH, why="65,536 requests in one batch")] = 1
    prompt_tokens: Tokens = 1
    output_tokens: Tokens = 1
    published: dict[str, Positive] = field(default_factory=dict)
    cost: CostSpec = CostSpec()

    def validate(self) -> None:
        for key in ("name", "source", "setup"):
            require(bool(getattr(self, key).strip()), key, "must say it (a case needs it)")
        require(bool(self.published), "published", f"must give a metric: {', '.join(METRICS)}")
        choices("published", tuple(self.published), METRICS)
        if self.cost.kind != "roofline":
            raise FieldError("cost.kind", "validation prices with the roofline model; allowed: "
                             "roofline")  # fmt: skip


def read_case(path: Path) -> ValidationCase:
    """The case of ``path``; one line naming the file and the key for anything wrong."""
    data = read_yaml_file(path, ConfigError, CONFIG_LIMITS, what="validation case")
    try:
        return build(ValidationCase, data if data is not None else {})
    except FieldError as err:
        raise ConfigError(f"{path}: {err}") from None
