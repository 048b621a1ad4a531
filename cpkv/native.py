"""The modules compiled with mypyc (the serving engines: cpkv's loop, SGLang's loop, vLLM's
scheduler model; the cluster's driver), and whether this process runs them compiled.

:data:`COMPILED` is the one list of them. ``setup.py`` reads it by parsing this file (without
importing cpkv) and compiles the modules as one group: the group's shared library
(:data:`SHARED_LIB`) and, beside each module's ``.py``, an extension that loads it. The build
records what it compiled in :data:`DIGEST_FILE` beside this file (:func:`digest_record`).

An extension beside a ``.py`` shadows it. :func:`guard`, run by ``import cpkv``, makes all the
listed modules load from their ``.py`` files when ``CPKV_PURE_PYTHON`` is set, when some
extension is missing, or when the sources differ from the recorded ones (or none are
recorded): all or none, since the group's modules call each other natively. Sources with the
recorded sizes and mtimes count as unchanged unread; sources with the recorded sizes but other
mtimes (a wheel's install, a touch) are hashed. :func:`status` says which case holds, and
:func:`built` whether the tree holds a build of its current sources. This module is never
compiled and imports only the standard library.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec

COMPILED = (
    "cpkv.admission.token_ratio",
    "cpkv.admission.cp_limit",
    "cpkv.serving.model.request",
    "cpkv.serving.model.kv_pool",
    "cpkv.serving.model.prefill_lane",
    "cpkv.serving.model.decode_ahead",
    "cpkv.serving.model.hits",
    "cpkv.serving.model.token_runs",
    "cpkv.serving.schedulers.plan",
    "cpkv.serving.schedulers.budget",
    "cpkv.serving.schedulers.options",
    "cpkv.serving.schedulers.base",
    "cpkv.serving.schedulers.adder_pass",
    "cpkv.serving.schedulers.prefill_adder",
    "cpkv.serving.schedulers.blocks",
    "cpkv.serving.schedulers.iteration",
    "cpkv.serving.schedulers.profiled",
    "cpkv.serving.cost.stretch",
    "cpkv.serving.cost.roofline",
    "cpkv.serving.input.arrivals",
    "cpkv.workload.sampling",
    "cpkv.serving.record.spill",
    "cpkv.serving.record.token_gaps",
    "cpkv.serving.record.iteration_log",
    "cpkv.serving.record.requests",
    "cpkv.serving.engine.stretch",
    "cpkv.serving.engine.handoff",
    "cpkv.serving.engine.instance",
    "cpkv.serving.engine.engine",
    "cpkv.serving.engine.sglang_engine",
    "cpkv.serving.engine.vllm_engine",
    "cpkv.serving.engine.vllm_stretch",
    "cpkv.serving.cluster.driver",
    "cpkv.serving.cluster.disagg.link",
    "cpkv.serving.cluster.disagg.tallies",
    "cpkv.serving.cluster.disagg.driver",
    "cpkv.sglang.config",
    "cpkv.sglang.request",
    "cpkv.sglang.radix",
    "cpkv.sglang.memory",
    "cpkv.sglang.adder",
    "cpkv.sglang.loop",
    "cpkv.vllm.config",
    "cpkv.vllm.request",
    "cpkv.vllm.block_pool",
    "cpkv.vllm.kv_cache",
    "cpkv.vllm.queue",
    "cpkv.vllm.decode",
    "cpkv.vllm.scheduler",
)
"""The modules mypyc compiles, in the order their digest reads them."""
GROUP = "cpkv._native"
"""The compilation group's name."""
SHARED_LIB = GROUP + "__mypyc"
"""The group's shared library (mypyc's name for it): every compiled module's code."""
DIGEST_FILE = "_native_digest.txt"
"""Written by the build beside this file: the digest of the sources it compiled."""
PURE_ENV = "CPKV_PURE_PYTHON"
"""Set (not to 0) at build time: compile nothing; at run time: load the sources."""

COMPILED_STATUS = "compiled"
EDITED = "source: edited since the build"
NOT_BUILT = "source: not built"
PURE = "source: CPKV_PURE_PYTHON"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_status = NOT_BUILT


def status() -> str:
    """How this process runs the listed modules: compiled, or from source and why."""
    return _status


def built(package_dir: str = _PACKAGE_DIR) -> bool:
    """Whether the tree holds a build of its current sources (whatever ``CPKV_PURE_PYTHON``
    asks of this process)."""
    return _build_state(package_dir, _extensions(package_dir)) == COMPILED_STATUS


def pure_requested() -> bool:
    """Whether ``CPKV_PURE_PYTHON`` asks for the sources (set and not 0)."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def source_path(package_dir: str, module: str) -> str:
    """The ``.py`` of a listed module, under the cpkv package directory."""
    return os.path.join(package_dir, *module.split(".")[1:]) + ".py"


def source_digest(package_dir: str = _PACKAGE_DIR, modules: tuple[str, ...] = COMPILED) -> str:
    """sha256 over each module's name, size and source bytes, in list order."""
    import hashlib

    digest = hashlib.sha256()
    for module in modules:
        with open(source_path(package_dir, module), "rb") as fh:
            data = fh.read()
        digest.update(f"{module} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def source_stats(package_dir: str = _PACKAGE_DIR, modules: tuple[str, ...] = COMPILED) -> list[str]:
    """One line per module: its name, its source's size and mtime (ns)."""
    lines = []
    for module in modules:
        st = os.stat(source_path(package_dir, module))
        lines.append(f"{module} {st.st_size} {st.st_mtime_ns}")
    return lines


def digest_record(package_dir: str = _PACKAGE_DIR, modules: tuple[str, ...] = COMPILED) -> str:
    """What the build writes to :data:`DIGEST_FILE`: the digest, then the sources' stats."""
    lines = [source_digest(package_dir, modules), *source_stats(package_dir, modules)]
    return "\n".join(lines) + "\n"


def guard() -> None:
    """Decide :func:`status`; unless compiled, load the listed modules from their sources."""
    global _status
    present = _extensions(_PACKAGE_DIR)
    _status = _decide(_PACKAGE_DIR, present)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SourceFinder)]
    if _status != COMPILED_STATUS and any(present):
        sys.meta_path.insert(0, SourceFinder(_PACKAGE_DIR))


def _decide(package_dir: str, present: list[bool]) -> str:
    return PURE if pure_requested() else _build_state(package_dir, present)


def _build_state(package_dir: str, present: list[bool]) -> str:
    if not all(present):
        return NOT_BUILT
    try:
        with open(os.path.join(package_dir, DIGEST_FILE), encoding="utf-8") as fh:
            recorded = fh.read().splitlines()
    except OSError:
        return EDITED
    return COMPILED_STATUS if _unchanged(package_dir, recorded) else EDITED


def _unchanged(package_dir: str, recorded: list[str]) -> bool:
    """The sources are the recorded ones: the same sizes and mtimes, else the same sizes and
    digest."""
    try:
        stats = source_stats(package_dir)
        if stats == recorded[1:]:
            return True
        if [_size(line) for line in stats] != [_size(line) for line in recorded[1:]]:
            return False
        return recorded[:1] == [source_digest(package_dir)]
    except OSError:
        return False


def _size(stat_line: str) -> str:
    """A :func:`source_stats` line without its mtime."""
    return stat_line.rpartition(" ")[0]


def _extensions(package_dir: str) -> list[bool]:
    """Whether each listed module's extension, then the shared library's, exists."""
    present = []
    for module in (*COMPILED, SHARED_LIB):
        stem = os.path.join(package_dir, *module.split(".")[1:])
        present.append(any(os.path.exists(stem + suffix) for suffix in EXTENSION_SUFFIXES))
    return present


class SourceFinder:
    """A ``sys.meta_path`` finder that loads the listed modules from their ``.py`` files and
    refuses the group's shared library."""

    def __init__(self, package_dir: str) -> None:
        self.sources = {module: source_path(package_dir, module) for module in COMPILED}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        if fullname == SHARED_LIB:
            raise ImportError(f"{SHARED_LIB} is not loaded: the serving engine runs from {_status}")
        source = self.sources.get(fullname)
        if source is None:
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(fullname, source)
