"""The serving engine's CPU work per iteration, and how much of it the GPU waits for
(``admit.cost.cpu``).

Every iteration the engine's CPU schedules the next batch, prepares its metadata (positions,
slot mappings, block tables), launches it (a CUDA graph replay or the kernels one by one)
and processes the last batch's outputs (sampling results, stop checks, detokenisation
hand-off). That work grows with the batch::

    cpu_us = iteration_us + request_us · sequences + token_us · tokens

``sequences`` the iteration's sequences that sample a token (each decoding request, and one
for the iteration's prefill: the rows the LM head runs on), ``tokens`` all the tokens it
computes. An engine that *overlaps* (SGLang's overlap scheduler, vLLM's async scheduling)
runs the CPU work of the next iteration while the GPU runs this one; the GPU waits only for
what is left when its own work is done. The part of the GPU's work taken as cover is the
one fixed by the batch's token count (GEMMs, elementwise kernels, all-reduces: ``cover_us``),
so that the waiting time depends on the token counts alone::

    overlap:    waited_us = max(0, cpu_us − cover_us)
    no overlap: waited_us = cpu_us

(attention and load-back are not counted as cover: when the CPU is the bottleneck and the
batch also reads much KV, the iteration is priced up to its attention time too slow.)

Defaults per engine (:data:`ENGINE_CPU`; ``admit.cost.cpu.engine``, null: ``admit.engine``):

* ``sglang`` — ``iteration_us`` 310: SGLang's measured time per decode step beyond the
  forward pass with one request (tenstorrent/tt-inference-server#3560: 2.94 ms TPOT against
  a 2.632 ms mocked forward); ``request_us`` 20: the gap between two decode steps of 256
  requests, 5–6 ms (vllm-project/vllm#10634, Llama-2-7B, ShareGPT; (5.5 − 0.31) ms / 256);
  no published profile separates SGLang's per-request work from vLLM's, so both take it;
  ``overlap`` true (on by default since sgl-project/sglang#2067; "zero-overhead batch
  scheduler", LMSYS SGLang v0.4 blog);
* ``vllm`` — the same work; ``overlap`` true (async scheduling on by default since
  vllm-project/vllm#27614), except with pipeline parallelism (vLLM turns it off there:
  vllm-project/vllm#31998);
* ``none`` — no CPU work in the loop: a compiled generation loop (gpt-fast's CUDA graphs,
  TensorRT-LLM's C++ session benchmark), for measurements that run no serving engine.

``token_us`` is 0 for both engines: no published profile separates a per-token CPU cost
(positions and slot mappings are prepared by vectorised array operations); set it from a
profile of your own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from cpkv.core.schema import FieldError, Range, choices

ENGINES = ("sglang", "vllm", "none")
MAX_CPU_US = 1e6
CpuUs = Annotated[float, Range(0, MAX_CPU_US, why="1 s of CPU per iteration or request")]


@dataclass(frozen=True)
class EngineCpu:
    """The resolved CPU work of one engine (module docstring)."""

    iteration_us: float
    request_us: float
    token_us: float
    overlap: bool

    def work_us(self, tokens: int, sequences: int) -> float:
        """The CPU work of an iteration of ``tokens`` tokens and ``sequences`` sampled rows."""
        return self.iteration_us + self.request_us * sequences + self.token_us * tokens

    def waited_us(self, tokens: int, sequences: int, cover_us: float) -> float:
        """What the GPU waits for of it, ``cover_us`` the GPU work that can hide it."""
        work = self.work_us(tokens, sequences)
        if not self.overlap:
            return work
        return work - cover_us if work > cover_us else 0.0


ENGINE_CPU = {
    "sglang": EngineCpu(310.0, 20.0, 0.0, True),
    "vllm": EngineCpu(310.0, 20.0, 0.0, True),
    "none": EngineCpu(0.0, 0.0, 0.0, True),
}
"""Each engine's defaults (module docstring for the sources)."""


def engine_family(serving_engine: str) -> str:
    """Whose CPU defaults a serving engine (``admit.engine``) takes: vLLM's for ``vllm``,
    SGLang's for SGLang's models (``sglang``, and any other SGLang scheduler cpkv runs)."""
    return "vllm" if serving_engine.startswith("vllm") else "sglang"


@dataclass(frozen=True)
class CpuSpec:
    """``admit.cost.cpu``: the engine whose defaults apply (null: ``admit.engine``'s) and any
    of its numbers replaced (null: the engine's)."""

    engine: str | None = None
    overlap: bool | None = None
    iteration_us: CpuUs | None = None
    request_us: CpuUs | None = None
    token_us: CpuUs | None = None

    def validate(self) -> None:
        if self.engine is not None:
            choices("engine", (self.engine,), ENGINES)
        if self.engine == "none" and self.overlap is not None:
            raise FieldError(
                "overlap", "engine none has no CPU work to overlap; allowed: null, or name an "
                "engine (sglang, vllm)",
            )  # fmt: skip

    def resolve(self, serving_engine: str = "sglang", pipeline_stages: int = 1) -> EngineCpu:
        """The numbers under ``serving_engine`` (``admit.engine``) when ``engine`` is null,
        the keys set here replacing the engine's."""
        engine = self.engine or engine_family(serving_engine)
        base = ENGINE_CPU[engine]
        overlap = base.overlap and not (engine == "vllm" and pipeline_stages > 1)
        return EngineCpu(
            base.iteration_us if self.iteration_us is None else self.iteration_us,
            base.request_us if self.request_us is None else self.request_us,
            base.token_us if self.token_us is None else self.token_us,
            overlap if self.overlap is None else self.overlap,
        )
