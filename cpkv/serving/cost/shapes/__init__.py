"""Model shapes for the roofline cost model: ``shape`` (the sizes of one model, their bounds,
the rules that make a shape possible, ``admit.cost.model_shape``) and ``registry`` (the models
``admit.cost.model`` names, from their published configs). Their names are this package's."""

from cpkv.serving.cost.shapes.registry import MODELS
from cpkv.serving.cost.shapes.shape import (
    MAX_TP,
    SIZE_BOUNDS,
    ModelShape,
    ShapeOverrides,
    resolve_shape,
    shape_problem,
)

__all__ = [
    "MAX_TP", "MODELS", "SIZE_BOUNDS", "ModelShape", "ShapeOverrides", "resolve_shape",
    "shape_problem",
]  # fmt: skip
