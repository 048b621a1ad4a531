"""Importing the real SGLang (an optional backend) on a CPU-only machine.

SGLang imports ``torchvision`` at module level through its multimodal configs, and the
PyPI builds of torchvision need a CUDA torch. When torchvision cannot be imported we put
inert placeholder modules in its place (nothing cpkv calls uses them), after letting
``transformers`` record that torchvision is unavailable so that it never takes a
torchvision code path.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import warnings
from typing import Any

from cpkv.core.errors import UnsupportedError

INSTALL_HINT = (
    "install the optional backend with `pip install 'cpkv[sglang]'`, or build the CPU oracle venv "
    "with ../shared/oracle/setup_oracle_venv.sh and run cpkv from it"
)
_TORCHVISION_MODULES = (
    "torchvision",
    "torchvision.io",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)


def sglang_available() -> bool:
    """True when the sglang package is installed (cheap: no import)."""
    return importlib.util.find_spec("sglang") is not None


def require_sglang(what: str) -> None:
    if not sglang_available():
        raise UnsupportedError(
            f"{what} needs the real sglang package, which is not installed; {INSTALL_HINT}"
        )


class _Inert:
    """Stands for any torchvision object: constructible, callable, any attribute."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


def _install_torchvision_placeholder() -> None:
    try:
        importlib.import_module("torchvision")
        return
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        for name in list(sys.modules):
            if name == "torchvision" or name.startswith("torchvision."):
                del sys.modules[name]
    try:
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
        getattr(import_utils, "is_torchvision_v2_available", lambda: None)()
    except ImportError:
        pass
    for name in _TORCHVISION_MODULES:
        module = _InertModule(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        sys.modules[name] = module


def import_sglang_module(name: str) -> Any:
    """Import ``sglang.<...>`` quietly on CPU, or raise UnsupportedError with an install hint."""
    require_sglang(f"`{name}`")
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    warnings.filterwarnings("ignore", module="sglang")
    warnings.filterwarnings("ignore", module="transformers")
    if "torchvision" not in sys.modules or isinstance(sys.modules["torchvision"], _InertModule):
        _install_torchvision_placeholder()
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001
        raise UnsupportedError(
            f"sglang is installed but `{name}` failed to import: {err}"
        ) from None
    logging.getLogger("sglang").setLevel(logging.ERROR)
    return module
