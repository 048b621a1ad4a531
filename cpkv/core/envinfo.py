"""What a run ran on: cpkv and git revision, Python, whether the serving engine ran compiled,
torch, device, host, CPU."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import cpkv
from cpkv import native


def git_info(path: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout holding ``path`` (cpkv's source by default)."""
    where = str(path or Path(cpkv.__file__).resolve().parent)
    try:
        commit = _git(where, "rev-parse", "HEAD")
        dirty = bool(_git(where, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def _git(cwd: str, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout.strip()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """Installed version of ``name`` without importing it (None when absent): the version
    in the name of its ``<name>-<version>.dist-info`` (or ``.egg-info``) folder, the first
    on ``sys.path`` (as ``importlib.metadata`` finds it, without its 20 ms import)."""
    wanted = _project(name)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in names:
            stem, dot, kind = item.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            project, dash, version = stem.partition("-")
            if dash and version and _project(project) == wanted:
                return version
    return None


def _project(name: str) -> str:
    """A project name as packaging normalises it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_info(device: str | None) -> dict[str, Any]:
    """Describe the device a run used. Imports torch only for CUDA devices."""
    if not device or not device.startswith("cuda"):
        return {"device": device or "cpu"}
    import torch

    if not torch.cuda.is_available():
        return {"device": device, "cuda_available": False}
    index = torch.device(device).index or 0
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(index),
        "cuda_version": torch.version.cuda,
    }


def torch_info() -> dict[str, Any]:
    """torch's version and intra-op threads (the thread count only once torch is imported)."""
    torch_loaded = sys.modules.get("torch")
    return {
        "torch": getattr(torch_loaded, "__version__", None) or package_version("torch"),
        "torch_threads": torch_loaded.get_num_threads() if torch_loaded is not None else None,
    }


def machine_info(device: str | None = None) -> dict[str, Any]:
    info = {
        "cpkv_version": cpkv.__version__,
        "git": git_info(),
        "python": platform.python_version(),
        "serving_engine": native.status(),
        **torch_info(),
        "numpy": package_version("numpy"),
        "sglang": package_version("sglang"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    info.update(device_info(device))
    return info
