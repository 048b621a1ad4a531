"""The Python example of docs/sglang-loop.md runs and prints what the page shows."""

from __future__ import annotations

from tests.helpers.page_example import run_page_example
from tests.helpers.paths import REPO


def test_the_example_prints_what_the_page_shows():
    printed, shown = run_page_example(REPO / "docs" / "sglang-loop.md")
    assert printed == shown
