"""Shared fixtures: a CLI runner writing into tmp_path, markers for optional hardware/packages.

The suite runs the serving engine from its sources (``CPKV_PURE_PYTHON``, set before cpkv is
imported): tests observe and patch its internals. The compiled build is checked against the
sources by ``tests/serving/test_compiled.py``."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

os.environ["CPKV_PURE_PYTHON"] = "1"

import pytest
from typer.testing import CliRunner

from cpkv.cli import app


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {
        "cuda": (_cuda, "no CUDA device on this machine"),
        "sglang": (lambda: _has("sglang"), "sglang is not installed (the optional real backend)"),
        "ray": (lambda: _has("ray"), "ray is not installed (the optional executor)"),
    }
    for item in items:
        for marker, (check, reason) in skips.items():
            if marker in item.keywords and not check():
                item.add_marker(pytest.mark.skip(reason=reason))


class Cli:
    """Invoke ``cpkv`` in-process; run directories go under ``tmp_path/exp``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runner = CliRunner()
        self.plots = False  # runs draw no plots/ unless a test asks (CPKV_PLOTS)

    def __call__(self, *args: str, output: bool = True):
        argv = list(args)
        if output and "-o" not in argv and "--output-dir" not in argv:
            argv += ["-o", str(self.root)]
        env = {"CPKV_PLOTS": "1" if self.plots else "0"}
        return self.runner.invoke(app, argv, catch_exceptions=False, env=env)

    def run_dirs(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted(p.parent for p in self.root.rglob("meta.json"))

    def results(self, run_dir: Path) -> dict:
        return json.loads((run_dir / "results.json").read_text())


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "exp")


@pytest.fixture
def spy(monkeypatch):
    """``spy(owner, "name")`` wraps ``owner.name`` and returns the list of the positional
    arguments of every call (the wrapped function still runs)."""

    def install(owner, name: str) -> list[tuple]:
        calls: list[tuple] = []
        original = getattr(owner, name)

        def recorded(*args, **kwargs):
            calls.append(args)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)
        return calls

    return install
