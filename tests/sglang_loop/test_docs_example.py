"""The Python example of docs/sglang-loop.md runs and prints what the page shows."""

from __future__ import annotations

import contextlib
import io
import re

from tests.helpers.paths import REPO

PAGE = REPO / "docs" / "sglang-loop.md"


def test_the_example_prints_what_the_page_shows():
    text = PAGE.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    shown = re.search(r"prints \(.*?\n\n```\n(.*?)```", text, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {})
    assert out.getvalue() == shown
