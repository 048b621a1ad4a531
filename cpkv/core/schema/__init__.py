"""Config schemas: building typed, frozen dataclasses from plain dicts (``fields``), the keys
of a schema as a whole (``keys``: every leaf with its bounds, keys that belong to another
choice) and the physical limits keys and input fields are bounded by (``limits``).

The names of ``fields`` are this package's own: ``from cpkv.core.schema import build``.
"""

from cpkv.core.schema.fields import (
    FieldError,
    Range,
    build,
    choices,
    each_positive,
    field_form,
    non_empty,
    non_negative,
    positive,
    require,
    to_dict,
)

__all__ = [
    "FieldError", "Range", "build", "choices", "each_positive", "field_form", "non_empty",
    "non_negative", "positive", "require", "to_dict",
]  # fmt: skip
