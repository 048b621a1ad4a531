"""``admit.cost``: which iteration-time model a serving run uses, and its numbers.

``kind`` picks the model (:data:`cpkv.serving.cost.base.COST_KINDS`):

* ``roofline`` (the default): ``model`` (a name of :data:`~cpkv.serving.cost.shapes.MODELS`,
  or null with every ``model_shape`` field given), ``model_shape`` (fields replacing the
  named model's), ``gpu`` (a name of :data:`~cpkv.serving.cost.gpus.GPUS`), ``gpu_spec``
  (datasheet numbers replacing the GPU's), ``tp`` (tensor-parallel degree: it must divide
  the model's heads), ``calibration`` (efficiencies, latencies, overhead; null keys take the
  GPU's defaults), ``quantization`` (null, or ``fp8``: one byte a weight, the GEMMs at the
  GPU's FP8 tensor-core peak, as vLLM's and SGLang's ``--quantization fp8``) and
  ``kv_cache_dtype`` (``auto``: the model's, or ``fp8``: one byte a KV element, as their
  ``--kv-cache-dtype fp8``), ``pp`` (pipeline stages, each of ``tp`` GPUs holding an even
  share of the layers), ``ep`` (1, or ``tp``: the experts of a mixture-of-experts model split
  whole over the tensor-parallel GPUs, tokens sent to them by all-to-all), ``cpu`` (the
  engine's CPU work per iteration and whether it
  overlaps the GPU's: :mod:`cpkv.serving.cost.cpu`; its ``engine`` null follows
  ``admit.engine``), ``allreduce`` (the tensor-parallel all-reduce's kernels: ``nccl``,
  ``sglang`` or ``vllm``, the engines' custom ones for small messages; null: the CPU's
  engine's, ``nccl`` for ``none``: :mod:`cpkv.serving.cost.allreduce`);
* ``linear``: ``fixed_us``, ``prefill_token_us``, ``decode_request_us``,
  ``context_token_us``, ``kv_bytes_per_token``, ``l2_load_gb_per_s`` and ``fit_points`` (a
  JSONL of measured iterations to fit the coefficients to).

A key of the other kind set to anything but its default is an error naming the key (it
would be ignored). Times are microseconds the clock can hold; ``kv_bytes_per_token`` is at
most :data:`MAX_KV_BYTES_PER_TOKEN`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from cpkv.core.errors import ConfigError
from cpkv.core.schema import FieldError, Range, choices
from cpkv.core.schema.keys import belongs_to
from cpkv.core.schema.limits import Microseconds
from cpkv.serving.cost.allreduce import ALLREDUCE_KINDS
from cpkv.serving.cost.base import COST_KINDS, IterationCost
from cpkv.serving.cost.calibration import CalibrationSpec
from cpkv.serving.cost.cp.spec import CpSpec
from cpkv.serving.cost.cpu import CpuSpec, engine_family
from cpkv.serving.cost.gpus import BANDWIDTH_GB_PER_S, GpuOverrides, fp8_gpus, resolve_gpu
from cpkv.serving.cost.shapes import (
    MAX_TP,
    ModelShape,
    ShapeOverrides,
    resolve_shape,
    shape_problem,
)

ROOFLINE_KEYS = (
    "model", "model_shape", "gpu", "gpu_spec", "tp", "calibration", "quantization",
    "kv_cache_dtype", "cpu", "pp", "ep", "allreduce", "cp",
)  # fmt: skip
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = ("auto", "fp8")
LINEAR_KEYS = (
    "fixed_us", "prefill_token_us", "decode_request_us", "context_token_us",
    "kv_bytes_per_token", "l2_load_gb_per_s", "fit_points",
)  # fmt: skip
MAX_KV_BYTES_PER_TOKEN = 1 << 26
"""64 MiB: over 100x the KV of one token of the largest published model (about 0.5 MiB)."""


@dataclass(frozen=True)
class CostSpec:
    """``admit.cost`` (see the module docstring)."""

    kind: str = "roofline"
    model: str | None = "llama-3-8b"
    model_shape: ShapeOverrides = ShapeOverrides()
    gpu: str = "h100-sxm"
    gpu_spec: GpuOverrides = GpuOverrides()
    tp: Annotated[int, Range(1, MAX_TP, why="it divides the heads, at most 1024")] = 1
    pp: Annotated[int, Range(1, MAX_TP, why="a stage holds a layer at least, at most 1024")] = 1
    ep: Annotated[int, Range(1, MAX_TP, why="1, or the tensor-parallel GPUs")] = 1
    calibration: CalibrationSpec = CalibrationSpec()
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    cpu: CpuSpec = CpuSpec()
    allreduce: str | None = None
    cp: CpSpec = CpSpec()
    fixed_us: Microseconds = 5000.0
    prefill_token_us: Microseconds = 30.0
    decode_request_us: Microseconds = 30.0
    context_token_us: Microseconds = 0.04
    kv_bytes_per_token: Annotated[
        int, Range(1, MAX_KV_BYTES_PER_TOKEN, why="over 100x the largest published model's")
    ] = 131072
    l2_load_gb_per_s: Annotated[float, BANDWIDTH_GB_PER_S["h2d_gb_per_s"]] | None = 50.0
    fit_points: str | None = None  # kind linear: JSONL of measured iterations to fit to

    def validate(self) -> None:
        if self.kind not in COST_KINDS:
            try:
                COST_KINDS.canonical(self.kind)
            except ConfigError as err:
                raise FieldError("kind", str(err)) from None
        roofline = self.kind == "roofline"
        belongs_to(
            self, LINEAR_KEYS if roofline else ROOFLINE_KEYS, owner="admit.cost.kind",
            needed="linear" if roofline else "roofline", chosen=self.kind,
            reads=ROOFLINE_KEYS if roofline else LINEAR_KEYS,
        )  # fmt: skip
        if roofline:
            if self.quantization is not None:
                choices("quantization", (self.quantization,), ("null", *QUANTIZATIONS))
            choices("kv_cache_dtype", (self.kv_cache_dtype,), KV_CACHE_DTYPES)
            if self.allreduce is not None:
                choices("allreduce", (self.allreduce,), ALLREDUCE_KINDS)
            shape = self.shape()
            gpu = resolve_gpu(self.gpu, self.gpu_spec)
            if self.quantization == "fp8" and gpu.fp8_tflops is None:
                raise FieldError(
                    "quantization",
                    f"fp8 needs FP8 tensor cores, and {self.gpu} has none; allowed: a GPU with "
                    f"them ({', '.join(fp8_gpus())}) or gpu_spec.fp8_tflops, or quantization null",
                )
            problem = shape_problem(shape, self.tp)
            if problem is not None:
                field, why = problem
                key = field if field == "tp" else f"model_shape.{field}"
                raise FieldError(key, why + ("" if field == "tp" else self._shape_origin(field)))
            self._check_parallelism(shape)

    def _check_parallelism(self, shape: ModelShape) -> None:
        """``cp`` valid and on one stage; ``pp`` at most the layers; ``ep`` 1, or the ``tp``
        GPUs of a model with experts that divide among them."""
        name = self.model or "given by model_shape"
        try:
            self.cp.validate()
        except FieldError as err:
            raise FieldError(f"cp.{err.key}", err.detail) from None
        if self.cp.size > 1 and self.pp > 1:
            raise FieldError(
                "cp.size", f"a CP rank holds the whole model, and pp is {self.pp}; allowed: "
                "cp.size 1 with pp > 1, or pp 1",
            )  # fmt: skip
        if self.pp > shape.layers:
            raise FieldError(
                "pp", f"must be at most the model's {shape.layers} layers (each stage holds one "
                f"at least), got {self.pp}",
            )  # fmt: skip
        if self.ep == 1:
            return
        if not shape.moe:
            raise FieldError(
                "ep", f"expert parallelism needs experts, and the model ({name}) has none; "
                "allowed: 1",
            )  # fmt: skip
        if self.ep != self.tp:
            raise FieldError(
                "ep", f"expert parallelism spans the tensor-parallel GPUs (vLLM's "
                f"--enable-expert-parallel, SGLang's --ep-size = --tp-size); allowed: 1 or "
                f"{self.tp} (tp), got {self.ep}",
            )  # fmt: skip
        if shape.experts % self.ep:
            raise FieldError(
                "ep", f"must divide the model's {shape.experts} experts (each GPU holds as "
                f"many), got {self.ep}",
            )  # fmt: skip

    def shape(self) -> ModelShape:
        """The model's shape, ``model_shape`` applied, then the bytes of ``quantization`` and
        ``kv_cache_dtype``; FieldError when ``model_shape`` gives other bytes."""
        shape = resolve_shape(self.model, self.model_shape)
        one_byte = {}
        if self.quantization == "fp8":
            one_byte["param_bytes"] = "quantization: fp8"
        if self.kv_cache_dtype == "fp8":
            one_byte["kv_bytes"] = "kv_cache_dtype: fp8"
        for field, why in one_byte.items():
            given = getattr(self.model_shape, field)
            if given not in (None, 1):
                raise FieldError(
                    f"model_shape.{field}", f"{given} bytes, and {why} stores 1; give one of them"
                )
        return replace(shape, **dict.fromkeys(one_byte, 1)) if one_byte else shape

    def _shape_origin(self, field: str) -> str:
        """Where a shape's field came from, when not from model_shape itself."""
        if getattr(self.model_shape, field, None) is not None or self.model is None:
            return ""
        return f" (model {self.model}, with the model_shape given)"

    def build(self, serving_engine: str = "sglang") -> IterationCost:
        """The model the serving loop calls; ``serving_engine`` (``admit.engine``) gives the
        CPU defaults when ``cpu.engine`` is null."""
        spec = self
        if self.cpu.engine is None:
            spec = replace(self, cpu=replace(self.cpu, engine=engine_family(serving_engine)))
        return COST_KINDS.get(self.kind)(spec)
