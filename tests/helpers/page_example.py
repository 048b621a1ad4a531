"""A manual page's Python example: run it and return what it printed and what the page shows
it prints (the block after the first ``prints (...)`` paragraph)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path


def run_page_example(page: Path) -> tuple[str, str]:
    """``(printed, shown)`` for the first ```python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    shown = re.search(r"prints \(.*?\n\n```\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(page), "exec"), {})
    return out.getvalue(), shown
