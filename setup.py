"""cpkv's build: the metadata is in pyproject.toml; this adds the serving engine's modules
compiled with mypyc (the list ``COMPILED`` in cpkv/native.py, read here without importing cpkv,
compiled as one group with the mypy options in mypyc.ini).

Compiling never fails the install: with ``CPKV_PURE_PYTHON`` set (not 0), without mypyc, or
when mypyc or the C compiler fails, cpkv installs as pure Python and one warning line on
stderr says why. A built tree records its sources' digest (cpkv.native.DIGEST_FILE) beside
the extensions: in the source tree for an editable or in-place build, in the package
otherwise.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "cpkv" / "native.py"
MYPY_CONFIG = "mypyc.ini"
C_DIR = os.path.join("build", "mypyc")
"""mypyc's generated C, relative to the project root."""
COMPILE_ERRORS = (CCompilerError, ExecError, PlatformError, ValueError, OSError)
EXTENSION_FIELDS = (
    "sources", "include_dirs", "define_macros", "undef_macros", "library_dirs", "libraries",
    "runtime_library_dirs", "extra_objects", "extra_compile_args", "extra_link_args",
    "depends", "language",
)  # fmt: skip


def native_constants(path: Path = NATIVE) -> dict[str, object]:
    """The top-level literal assignments of cpkv/native.py (name -> value)."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def compiled_modules(path: Path = NATIVE) -> tuple[str, ...]:
    """cpkv.native.COMPILED, read from the source."""
    return tuple(native_constants(path)["COMPILED"])


def source_file(module: str) -> str:
    """A module's ``.py``, relative to the project root."""
    return os.path.join(*module.split(".")) + ".py"


def load_native_helpers() -> dict[str, Any]:
    """cpkv/native.py run on its own (it imports only the standard library): its digest
    functions, without importing the cpkv package."""
    import runpy

    return runpy.run_path(str(NATIVE), run_name="cpkv_native_for_setup")


def pure_reason() -> str | None:
    """Why this build compiles nothing, or None to compile."""
    native = load_native_helpers()
    if native["pure_requested"]():
        return f"{native['PURE_ENV']}={os.environ[native['PURE_ENV']]}"
    try:
        import mypyc.build  # noqa: F401
    except ImportError as exc:
        return f"mypyc is not importable ({exc})"
    return None


def warn(reason: str) -> None:
    print(f"cpkv: the serving engine runs uncompiled (slower): {reason}", file=sys.stderr)


def planned_extensions() -> list[Extension]:
    """One extension per name mypyc will build (the group's shared library, then one per
    module), without sources: build_ext fills them in when it compiles."""
    names = [load_native_helpers()["SHARED_LIB"], *compiled_modules()]
    return [Extension(name, sources=[]) for name in names]


def mypyc_extensions(modules: tuple[str, ...], group: str) -> list[Extension]:
    """mypyc's extensions for the modules as one group (writes the C under build/mypyc)."""
    from mypyc.build import mypycify

    paths = [source_file(module) for module in modules]
    # No mypy cache: with one, mypyc (incremental in its separate mode) generates no C for
    # cached modules and links an empty shared library.
    options = ["--config-file", MYPY_CONFIG, "--cache-dir", os.devnull]
    return mypycify([*paths, *options], opt_level="3", separate=[(paths, group)], target_dir=C_DIR)


class BuildNative(build_ext):
    """Compiles the planned extensions with mypyc and records the digest; on any failure
    builds none, removes this build's stale outputs and warns once."""

    def run(self) -> None:
        reason = pure_reason() or self._compile()
        if reason is not None:
            self._remove_outputs()
            self.extensions = []
            warn(reason)

    def _compile(self) -> str | None:
        """Build the extensions and record their digest: None, else why not."""
        try:
            record = load_native_helpers()["digest_record"](str(ROOT / "cpkv"), compiled_modules())
            self._fill_from_mypyc()
        except (Exception, SystemExit) as exc:
            return f"mypyc failed: {_describe(exc)}"
        try:
            super().run()
        except COMPILE_ERRORS as exc:
            return f"compiling failed: {_describe(exc)}"
        self._write_digest(record)
        return None

    def _fill_from_mypyc(self) -> None:
        constants = native_constants()
        built = {
            ext.name: ext for ext in mypyc_extensions(compiled_modules(), str(constants["GROUP"]))
        }
        planned = {ext.name for ext in self.extensions}
        if set(built) != planned:
            raise ValueError(f"mypyc built {sorted(built)}, setup.py planned {sorted(planned)}")
        for ext in self.extensions:
            for field in EXTENSION_FIELDS:
                setattr(ext, field, getattr(built[ext.name], field))

    def _digest_paths(self) -> list[str]:
        """The digest in build_lib, then (building in place) in the source tree."""
        name = str(native_constants()["DIGEST_FILE"])
        paths = [os.path.join(self.build_lib, "cpkv", name)]
        if self.inplace:
            paths.append(os.path.join(ROOT, "cpkv", name))
        return paths

    def _write_digest(self, record: str) -> None:
        for path in self._digest_paths():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(record)

    def _remove_outputs(self) -> None:
        """This build's extensions and digest left in build_lib by an earlier build: a pure
        build must not ship them. A source tree's in-place build stays: the guard runs it only
        while its recorded sources are the tree's (cpkv.native)."""
        paths = [self._digest_paths()[0]]  # (build_lib's)
        for ext in self.extensions:
            filename = self.get_ext_filename(self.get_ext_fullname(ext.name))
            paths.append(os.path.join(self.build_lib, filename))
        for path in paths:
            if os.path.exists(path):
                os.remove(path)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it stopped (exit {exc.code}; its messages are above)"
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


if __name__ == "__main__":
    setup(ext_modules=planned_extensions(), cmdclass={"build_ext": BuildNative})
