"""What a listing reads of a finished run: ``meta.json``'s ``listed`` block, written as the run
finishes, holding its headline (:func:`cpkv.runs.headline.headline` of its results) and a
digest of each file the listing vouches for (``results.json``, ``config.yaml``).

A listing reads ``meta.json`` and those two files' bytes, and takes the headline from
``meta.json`` only when both files still have the digests the run wrote (parsing neither);
otherwise (a file changed, damaged or missing, a run written before this block existed) it
reads the run back in full, which says what is wrong.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpkv.runs.headline import headline
from cpkv.runs.results import RunRecord

KEY = "listed"
"""The block's key in ``meta.json``."""
FILES = ("results.json", "config.yaml")
"""The files whose digests the block holds."""


def digest(data: bytes) -> str:
    """A file's digest: its size and its SHA-1 (a check against damage and edits, not an
    adversary; the fastest of hashlib's for small files)."""
    return f"{len(data)}:{hashlib.sha1(data, usedforsecurity=False).hexdigest()}"


def block_of(results_text: str, config_text: str) -> dict[str, Any]:
    """The block for a run whose ``results.json`` and ``config.yaml`` hold these texts (the
    headline of the results as they read back)."""
    record = RunRecord.from_json(results_text)
    texts = {"results.json": results_text, "config.yaml": config_text}
    return {
        "headline": headline(record),
        "files": {name: digest(texts[name].encode("utf-8")) for name in FILES},
    }


def listed_headline(path: Path, meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The headline ``meta.json`` (``meta``) of the run at ``path`` holds, when its files still
    have their digests; None when they do not or it holds none (read the run in full)."""
    block = meta.get(KEY)
    if not isinstance(block, Mapping):
        return None
    files, values = block.get("files"), block.get("headline")
    if not isinstance(files, Mapping) or not _numbers(values):
        return None
    folder = str(path)
    for name in FILES:
        try:
            with open(os.path.join(folder, name), "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        if files.get(name) != digest(data):
            return None
    return values


def _numbers(values: Any) -> bool:
    """A headline: a mapping of names to numbers (what ``cpkv ls`` formats)."""
    return isinstance(values, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()
    )
