"""Batches of bytes a run logs as it goes and reads back at its end: kept in memory, or
written to an unlinked temporary file (in the run directory, when given) and indexed, so that
a million-request run's logs do not stay in memory."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any


class Spill:
    """Batches of one or more byte strings each, read back in the order appended."""

    def __init__(self, keep: bool, spill_dir: Any, prefix: str) -> None:
        self.keep, self.spill_dir, self.prefix = keep, spill_dir, prefix
        self.batches: list[tuple[bytes, ...]] = []  # kept in memory
        self.file: Any = None  # else spilled: (offset, the parts' sizes) each
        self.index: list[tuple[int, tuple[int, ...]]] = []

    def append(self, *parts: bytes) -> None:
        """One batch of ``parts``."""
        if self.keep:
            self.batches.append(parts)
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.spill_dir, prefix=self.prefix)
        offset = self.file.seek(0, os.SEEK_END)
        for part in parts:
            self.file.write(part)
        self.index.append((offset, tuple(len(part) for part in parts)))

    def __iter__(self) -> Iterator[tuple[bytes, ...]]:
        yield from self.batches
        if self.file is None:
            return
        for offset, sizes in self.index:
            self.file.seek(offset)
            data = self.file.read(sum(sizes))
            parts, at = [], 0
            for size in sizes:
                parts.append(data[at : at + size])
                at += size
            yield tuple(parts)

    def discard(self) -> None:
        """Close the temporary file (it was unlinked when created)."""
        if self.file is not None:
            self.file.close()
            self.file = None
