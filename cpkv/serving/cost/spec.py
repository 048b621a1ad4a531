"""``admit.cost``: which iteration-time model a serving run uses, and its numbers.

``kind`` picks the model (:data:`cpkv.serving.cost.base.COST_KINDS`):

* ``roofline`` (the default): ``model`` (a name of :data:`~cpkv.serving.cost.shapes.MODELS`,
  or null with every ``model_shape`` field given), ``model_shape`` (fields replacing the
  named model's), ``gpu`` (a name of :data:`~cpkv.serving.cost.gpus.GPUS`), ``gpu_spec``
  (datasheet numbers replacing the GPU's), ``tp`` (tensor-parallel degree: it must divide
  the model's heads), ``calibration`` (efficiencies, latencies, overhead; null keys take the
  GPU's defaults);
* ``linear``: ``fixed_us``, ``prefill_token_us``, ``decode_request_us``,
  ``context_token_us``, ``kv_bytes_per_token``, ``l2_load_gb_per_s`` and ``fit_points`` (a
  JSONL of measured iterations to fit the coefficients to).

A key of the other kind set to anything but its default is an error naming the key (it
would be ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpkv.core.errors import ConfigError
from cpkv.core.schema import FieldError, non_negative, positive, require
from cpkv.serving.cost.base import COST_KINDS, IterationCost
from cpkv.serving.cost.calibration import CalibrationSpec
from cpkv.serving.cost.gpus import GpuOverrides, resolve_gpu
from cpkv.serving.cost.shapes import ShapeOverrides, resolve_shape

ROOFLINE_KEYS = ("model", "model_shape", "gpu", "gpu_spec", "tp", "calibration")
LINEAR_KEYS = (
    "fixed_us", "prefill_token_us", "decode_request_us", "context_token_us",
    "kv_bytes_per_token", "l2_load_gb_per_s", "fit_points",
)  # fmt: skip


@dataclass(frozen=True)
class CostSpec:
    """``admit.cost`` (see the module docstring)."""

    kind: str = "roofline"
    model: str | None = "llama-3-8b"
    model_shape: ShapeOverrides = ShapeOverrides()
    gpu: str = "h100-sxm"
    gpu_spec: GpuOverrides = GpuOverrides()
    tp: int = 1
    calibration: CalibrationSpec = CalibrationSpec()
    fixed_us: float = 5000.0
    prefill_token_us: float = 30.0
    decode_request_us: float = 30.0
    context_token_us: float = 0.04
    kv_bytes_per_token: int = 131072
    l2_load_gb_per_s: float | None = 50.0
    fit_points: str | None = None  # kind linear: JSONL of measured iterations to fit to

    def validate(self) -> None:
        if self.kind not in COST_KINDS:
            try:
                COST_KINDS.canonical(self.kind)
            except ConfigError as err:
                raise FieldError("kind", str(err)) from None
        for key in ("fixed_us", "prefill_token_us", "decode_request_us", "context_token_us"):
            non_negative(key, getattr(self, key))
        positive("kv_bytes_per_token", self.kv_bytes_per_token)
        positive("l2_load_gb_per_s", self.l2_load_gb_per_s, allow_none=True)
        positive("tp", self.tp)
        other = LINEAR_KEYS if self.kind == "roofline" else ROOFLINE_KEYS
        default = CostSpec()
        for key in other:
            require(
                getattr(self, key) == getattr(default, key),
                key,
                f"belongs to kind {'linear' if self.kind == 'roofline' else 'roofline'}, and "
                f"this admit.cost.kind is {self.kind} (it would be ignored); set "
                f"admit.cost.kind={'linear' if self.kind == 'roofline' else 'roofline'} to use "
                f"it, or remove it (kind {self.kind} reads: "
                f"{', '.join(ROOFLINE_KEYS if self.kind == 'roofline' else LINEAR_KEYS)})",
            )
        if self.kind == "roofline":
            shape = resolve_shape(self.model, self.model_shape)
            resolve_gpu(self.gpu, self.gpu_spec)
            require(
                shape.heads % self.tp == 0,
                "tp",
                f"must divide the model's {shape.heads} attention heads, got {self.tp}",
            )

    def build(self) -> IterationCost:
        """The model the serving loop calls."""
        return COST_KINDS.get(self.kind)(self)
