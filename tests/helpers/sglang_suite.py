"""The two things every differential suite against real sglang does: mark its tests ``sglang``
and skip them loudly (a warning naming what did not run) when sglang cannot be imported."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


def sglang_marks(skip_text: str) -> list:
    """``pytestmark`` for a suite: ``sglang``, skipped with ``skip_text`` (warned once at
    collection) when sglang is not installed."""
    if not HAVE_SGLANG:
        warnings.warn(skip_text, stacklevel=2)
    return [pytest.mark.sglang, pytest.mark.skipif(not HAVE_SGLANG, reason=skip_text)]


def load_or_skip(skip_text: str) -> None:
    """Import sglang once (about 7 s); warn and skip the module's tests if it fails."""
    from cpkv.admission.sglang.world import load_sglang
    from cpkv.core.errors import UnsupportedError

    try:
        load_sglang()
    except UnsupportedError as err:
        warnings.warn(f"{skip_text} ({err})", stacklevel=2)
        pytest.skip(f"{skip_text} ({err})")
