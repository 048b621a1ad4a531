"""The mypyc build of the serving engine: setup.py compiles the modules cpkv.native.COMPILED
lists, and the guard makes a tree whose sources changed since its build run all of them from
source. The guard is checked on copies of the package, with empty files planted as its
extensions (a guard that let one load would fail the import) and, when this tree is built,
with its real ones."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import cpkv
from cpkv import native
from cpkv.core.envinfo import machine_info
from tests.helpers.paths import REPO

PACKAGE = Path(cpkv.__file__).resolve().parent
RUNS_COMPILED = native.status() == native.COMPILED_STATUS
NOT_COMPILED_REASON = f"this process runs the serving engine's sources ({native.status()})"
NOT_BUILT_REASON = "this tree holds no build of its current sources"
EDITED_MODULE = "cpkv.serving.schedulers.iteration"
PROBE = """
import importlib, json, sys
import cpkv.native as native
files = {}
if sys.argv[1] == "import":
    files = {m: importlib.import_module(m).__file__ for m in native.COMPILED}
print(json.dumps({"status": native.status(), "built": native.built(), "files": files,
                  "shared_lib_loaded": native.SHARED_LIB in sys.modules}))
"""


def _setup_namespace() -> dict:
    pytest.importorskip("setuptools")
    return runpy.run_path(str(REPO / "setup.py"), run_name="cpkv_setup_under_test")


def test_setup_compiles_the_modules_cpkv_native_lists(tmp_path: Path):
    setup = _setup_namespace()
    assert setup["compiled_modules"]() == native.COMPILED
    names = [ext.name for ext in setup["planned_extensions"]()]
    assert names == [native.SHARED_LIB, *native.COMPILED]
    unimportable = tmp_path / "native.py"  # read, not run
    unimportable.write_text('import not_installed\nCOMPILED = ("cpkv.x",)\n')
    assert setup["compiled_modules"](unimportable) == ("cpkv.x",)


def test_the_shared_library_has_mypycs_name_for_the_group():
    common = pytest.importorskip("mypyc.common")
    assert common.shared_lib_name(native.GROUP) == native.SHARED_LIB


def test_setup_records_the_digest_cpkv_native_checks():
    record = _setup_namespace()["load_native_helpers"]()["digest_record"](str(PACKAGE))
    assert record == native.digest_record()
    assert record.splitlines()[0] == native.source_digest()


def test_every_listed_module_is_a_source_of_the_package():
    assert len(set(native.COMPILED)) == len(native.COMPILED)
    for module in native.COMPILED:
        assert module.startswith("cpkv."), module
        assert Path(native.source_path(str(PACKAGE), module)).is_file(), module


@pytest.mark.skipif(not RUNS_COMPILED, reason=NOT_COMPILED_REASON)
def test_a_built_tree_runs_the_listed_modules_compiled():
    for module in native.COMPILED:
        path = importlib.import_module(module).__file__
        assert path and path.endswith(tuple(EXTENSION_SUFFIXES)), (module, path)
    assert native.SHARED_LIB in sys.modules


def test_the_run_record_says_how_the_serving_engine_ran():
    assert machine_info()["serving_engine"] == native.status()


def _copy_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "cpkv", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "cpkv"


def _extension_files(package: Path, suffixes: list[str] = EXTENSION_SUFFIXES) -> list[Path]:
    """Every listed module's extension files, then the shared library's, under ``package``."""
    names = (*native.COMPILED, native.SHARED_LIB)
    stems = [package.joinpath(*name.split(".")[1:]) for name in names]
    return [stem.with_name(stem.name + suffix) for stem in stems for suffix in suffixes]


def _plant_build(package: Path) -> None:
    """Empty files as every extension, and the digest of the copy's sources."""
    for path in _extension_files(package):
        path.unlink(missing_ok=True)
    for path in _extension_files(package, EXTENSION_SUFFIXES[:1]):
        path.touch()
    (package / native.DIGEST_FILE).write_text(native.digest_record(str(package)))


def _edit(package: Path) -> None:
    with open(native.source_path(str(package), EDITED_MODULE), "a", encoding="utf-8") as fh:
        fh.write("# edited after the build\n")


def _probe(package: Path, *, imports: bool, pure: str | None = None) -> dict:
    """Import cpkv from the copy in a fresh interpreter (and every listed module)."""
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env["PYTHONPATH"] = str(package.parent)
    if pure is not None:
        env[native.PURE_ENV] = pure
    mode = "import" if imports else "status"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        cwd=package.parent, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _assert_sources(probe: dict, package: Path) -> None:
    assert probe["files"] == {m: native.source_path(str(package), m) for m in native.COMPILED}
    assert not probe["shared_lib_loaded"]


def test_the_guard_loads_every_listed_module_from_source_once_one_is_edited(tmp_path: Path):
    package = _copy_package(tmp_path)
    _plant_build(package)
    assert _probe(package, imports=False)["status"] == native.COMPILED_STATUS
    _edit(package)
    probe = _probe(package, imports=True)
    assert probe["status"] == native.EDITED and not probe["built"]
    _assert_sources(probe, package)


def test_cpkv_pure_python_loads_every_listed_module_from_source(tmp_path: Path):
    package = _copy_package(tmp_path)
    _plant_build(package)
    probe = _probe(package, imports=True, pure="1")
    assert probe["status"] == native.PURE and probe["built"]
    _assert_sources(probe, package)
    assert _probe(package, imports=False, pure="0")["status"] == native.COMPILED_STATUS


def test_the_guard_hashes_sources_whose_mtimes_changed(tmp_path: Path):
    """A touched source with the recorded bytes still counts as compiled; the same size with
    other bytes does not."""
    package = _copy_package(tmp_path)
    _plant_build(package)
    source = Path(native.source_path(str(package), EDITED_MODULE))
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 10**9))
    assert _probe(package, imports=False)["status"] == native.COMPILED_STATUS
    text = source.read_bytes()
    source.write_bytes(text[:-1] + (b" " if text[-1:] != b" " else b"\n"))
    assert _probe(package, imports=False)["status"] == native.EDITED


def test_the_guard_wants_a_digest_and_every_extension(tmp_path: Path):
    package = _copy_package(tmp_path)
    _plant_build(package)
    (package / native.DIGEST_FILE).unlink()
    assert _probe(package, imports=False)["status"] == native.EDITED
    _plant_build(package)
    _extension_files(package, EXTENSION_SUFFIXES[:1])[0].unlink()
    assert _probe(package, imports=False)["status"] == native.NOT_BUILT
    for path in _extension_files(package):
        path.unlink(missing_ok=True)
    assert _probe(package, imports=False)["status"] == native.NOT_BUILT


@pytest.mark.skipif(not native.built(), reason=NOT_BUILT_REASON)
def test_a_copy_of_the_built_tree_runs_compiled_until_edited(tmp_path: Path):
    package = _copy_package(tmp_path)
    probe = _probe(package, imports=True)
    assert probe["status"] == native.COMPILED_STATUS and probe["shared_lib_loaded"]
    for module, path in probe["files"].items():
        assert path.endswith(tuple(EXTENSION_SUFFIXES)), (module, path)
    _edit(package)
    probe = _probe(package, imports=True)
    assert probe["status"] == native.EDITED
    _assert_sources(probe, package)
