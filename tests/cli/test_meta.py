"""Every command has help; `cpkv --help` does not import torch."""

from __future__ import annotations

import subprocess
import sys

import typer.main
from typer.testing import CliRunner

from cpkv.cli import app


def all_commands() -> list[list[str]]:
    out: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:
        out.append(path)
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def test_every_command_has_help_with_a_description() -> None:
    runner = CliRunner()
    commands = all_commands()
    assert ["alloc", "host"] in commands
    for path in commands:
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, path
        assert "Usage:" in res.output
        cmd = typer.main.get_command(app)
        for part in path:
            cmd = cmd.commands[part]  # type: ignore[attr-defined]
        assert (cmd.help or "").strip(), f"{path} has no help text"


def test_help_does_not_import_heavy_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cpkv", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    for heavy in ("torch", "numpy", "omegaconf", "sglang", "matplotlib"):
        assert heavy not in imported, f"`cpkv --help` imports {heavy}"
    assert "Usage:" in out.stdout


def test_top_level_help_lists_every_leaf_command() -> None:
    res = CliRunner().invoke(app, ["--help"])
    leaves = [p for p in all_commands() if p and not _is_group(p)]
    for path in leaves:
        assert "cpkv " + " ".join(path) in res.output, path


def _is_group(path: list[str]) -> bool:
    cmd = typer.main.get_command(app)
    for part in path:
        cmd = cmd.commands[part]  # type: ignore[attr-defined]
    return hasattr(cmd, "commands")


def test_help_lists_every_registry_name() -> None:
    """DESIGN: the YAML name is the registry key and the help text lists the keys. The help
    texts are static (no import of the registries' modules), so this guards them against drift."""
    from cpkv.admission.ticks import BACKENDS
    from cpkv.alloc.host.impls import HOST_IMPLS
    from cpkv.alloc.host.schema import HOST_METHODS, HOST_OPS, HOST_PATTERNS, PROTOCOLS
    from cpkv.alloc.l1.impls import L1_IMPLS
    from cpkv.alloc.l1.layouts import FREE_PATTERNS, OWNER_PATTERNS
    from cpkv.alloc.l1.schema import L1_OPS
    from cpkv.policies.blocks import SCANS
    from cpkv.policies.registry import POLICIES
    from cpkv.policies.victims import VICTIMS
    from cpkv.serving.cluster.routers import ROUTERS
    from cpkv.serving.cost.base import COST_KINDS
    from cpkv.serving.cost.gpus import GPUS
    from cpkv.serving.cost.shapes import MODELS
    from cpkv.trace.readers import TRACE_FORMATS
    from cpkv.workload.sources import SOURCES

    expected = {
        ("alloc", "host"): [*HOST_IMPLS.allowed(), *HOST_METHODS, *HOST_PATTERNS, *HOST_OPS,
                            *PROTOCOLS],
        ("alloc", "l1"): [*L1_IMPLS.allowed(), *FREE_PATTERNS, *OWNER_PATTERNS, *L1_OPS],
        ("admit",): [*SOURCES.names(), *TRACE_FORMATS.allowed(), *BACKENDS.names(),
                     *POLICIES.names(), *SCANS.names(), *VICTIMS.names(), *ROUTERS.names(),
                     *COST_KINDS.names(), *MODELS.allowed(), *GPUS.allowed()],
    }  # fmt: skip
    runner = CliRunner()
    for path, names in expected.items():
        text = " ".join(runner.invoke(app, [*path, "--help"], terminal_width=200).output.split())
        missing = [n for n in names if n not in text]
        assert not missing, (path, missing)
