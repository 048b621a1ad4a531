"""The package layering of docs/ARCHITECTURE.md, checked on the source: every module's imports
(outside ``if TYPE_CHECKING:`` blocks) go only to the packages its own package may import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PACKAGE_ROOT = REPO / "cpkv"
BELOW_CAPABILITIES = {"core", "runs"}
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "runs": {"core"},
    "trace": BELOW_CAPABILITIES,
    "workload": BELOW_CAPABILITIES | {"trace"},
    "admission": BELOW_CAPABILITIES | {"trace", "workload"},
    "policies": BELOW_CAPABILITIES | {"workload"},
    "serving": BELOW_CAPABILITIES | {"trace", "workload", "admission", "policies", "vllm", "sglang"},
    "alloc": BELOW_CAPABILITIES,
    "vllm": set(),
    "sglang": set(),
    "admit": BELOW_CAPABILITIES | {"trace", "workload", "admission", "policies", "serving", "vllm", "sglang"},
    "validate": BELOW_CAPABILITIES | {"serving"},
    "sweep": BELOW_CAPABILITIES,
    "capacity": BELOW_CAPABILITIES | {"sweep"},
    "diff": BELOW_CAPABILITIES | {"sweep"},
    "plots": BELOW_CAPABILITIES | {"sweep", "trace", "capacity"},
    "cli": {"core", "runs", "trace", "workload", "admission", "policies", "serving", "alloc",
            "admit", "sweep", "capacity", "diff", "plots", "validate"},
}  # fmt: skip
ONLY_IN = {
    "typer": "cli",
    "rich": "cli",
    "omegaconf": "core/config.py",
    "tabulate": "runs/report.py",
}


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE_ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, imported module) of every import that runs (TYPE_CHECKING blocks skipped)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


MODULES = sorted(p for p in PACKAGE_ROOT.rglob("*.py") if _package(p))


def test_every_package_has_a_rule():
    assert {_package(p) for p in MODULES} == set(MAY_IMPORT)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_imports_follow_the_layering(path: Path):
    own = _package(path)
    allowed = MAY_IMPORT[own] | {own}
    rel = str(path.relative_to(PACKAGE_ROOT))
    bad = []
    for line, name in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        parts = name.split(".")
        if parts[0] == "cpkv" and len(parts) > 2 and parts[1] in MAY_IMPORT:
            if parts[1] not in allowed:
                bad.append(f"{rel}:{line} imports {name} ({own} may import: {sorted(allowed)})")
        owner = ONLY_IN.get(parts[0])
        if owner is not None and not (rel == owner or rel.startswith(owner + "/")):
            bad.append(f"{rel}:{line} imports {parts[0]} (only cpkv/{owner} may)")
    assert not bad, "\n".join(bad)


SERVING = PACKAGE_ROOT / "serving"
SERVING_MAY_IMPORT: dict[str, set[str]] = {
    "schema": set(),
    "cost": set(),
    "model": set(),
    "schedulers": {"model"},
    "record": {"model", "cost"},
    "input": {"model", "schema"},
    "engine": {"model", "schedulers", "cost", "record", "input"},
    "cluster": {"engine", "model", "record", "input", "cost", "schema"},
    "engine_choice": set(),
    "run": {"engine", "model", "record", "input", "cost", "schema", "cluster", "engine_choice"},
}  # fmt: skip
"""Inside ``cpkv/serving``: which of its parts each part may import (the state, then the
schedulers and the records of it, then the engine that drives them)."""
SERVING_MODULES = sorted(p for p in SERVING.rglob("*.py") if p.name != "__init__.py")


def _serving_part(path: Path) -> str:
    rel = path.relative_to(SERVING)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@pytest.mark.parametrize("path", SERVING_MODULES, ids=lambda p: str(p.relative_to(SERVING)))
def test_serving_parts_follow_their_layering(path: Path):
    own = _serving_part(path)
    allowed = SERVING_MAY_IMPORT[own] | {own, "schema"}  # (the config blocks: anyone's)
    bad = []
    for line, name in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        parts = name.split(".")
        if parts[:2] == ["cpkv", "serving"] and len(parts) > 3 and parts[2] not in allowed:
            bad.append(
                f"serving/{path.relative_to(SERVING)}:{line} imports {name} ({own} may import: {sorted(allowed)})"
            )
    assert not bad, "\n".join(bad)


def test_serving_folders_stay_small():
    """No folder of ``cpkv/serving`` holds more than 12 modules."""
    for folder in [
        SERVING,
        *(p for p in SERVING.rglob("*") if p.is_dir() and p.name != "__pycache__"),
    ]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 12, f"{folder.relative_to(REPO)} holds {len(modules)} modules"


def test_the_checker_sees_a_planted_violation():
    """The rule would catch core importing the CLI, and ignores type-only imports."""
    planted = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cpkv.serving.engine.engine import Engine\n"
        "from cpkv.cli import app\n"
    )
    assert [name for _, name in _imports(planted)] == ["typing.TYPE_CHECKING", "cpkv.cli.app"]
    assert "cli" not in MAY_IMPORT["core"]


def test_architecture_doc_names_only_real_files_and_every_package():
    """docs/ARCHITECTURE.md stays true: each cpkv/... path it names exists, each package has
    a bullet."""
    import re

    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paths = set(re.findall(r"`(cpkv/[\w/]+\.py)`", doc))
    assert paths, "the doc names no module"
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"named in docs/ARCHITECTURE.md but missing: {missing}"
    bullets = set(re.findall(r"^- \*\*`cpkv/(\w+)/`\*\*", doc, flags=re.M))
    assert bullets == set(MAY_IMPORT)
