"""Will a run fit in this machine's memory? Checked from the config, before anything is created.

A kind may name an *estimate* (``KindSpec.memory``): ``estimate(config) -> MemoryNeed | None``,
a lower bound of the bytes its largest structure takes, with the config keys that decide it. A
run whose need exceeds the memory available now is refused with one line
(``... needs 1.2e+04 GiB, this machine has 21.3 GiB available``) instead of ending in
``MemoryError`` (or the kernel's OOM killer) half-way through, with a run directory left behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cpkv.core.errors import UnsupportedError

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryNeed:
    """``bytes`` (an estimate, a lower bound) and what needs them (config keys and sizes)."""

    bytes: float
    what: str


def available_bytes() -> int | None:
    """Memory this process can use now: ``MemAvailable``, capped by a cgroup (container) limit;
    None when the platform does not say."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit = _cgroup_room()
    return min(avail, limit) if limit is not None else avail


def _cgroup_room() -> int | None:
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        return max(0, int(text) - used)
    except (OSError, ValueError):
        return None


def gib(size: float) -> str:
    """``21.3 GiB``, ``1.2e+04 GiB``: three significant digits."""
    return f"{size / GIB:.3g} GiB"


def check_fits(need: MemoryNeed | None, available: int | None = None) -> None:
    """UnsupportedError when ``need`` exceeds the memory ``available`` (default: now)."""
    if need is None:
        return
    room = available_bytes() if available is None else available
    if room is not None and need.bytes > room:
        raise UnsupportedError(
            f"{need.what} needs at least {gib(need.bytes)}, this machine has {gib(room)} available; "
            "allowed: a smaller size"
        )


def file_bytes(path: str | None) -> int:
    """The size of ``path`` in bytes (0 when it is not a readable file: reading it says why)."""
    if path is None:
        return 0
    try:
        return max(0, Path(path).stat().st_size)
    except (OSError, ValueError):
        return 0
