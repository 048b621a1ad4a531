"""The figures the plotting code writes, kept open for a test to read."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def figures(monkeypatch):
    """Every figure the run and sweep plots write (really written, so laid out), by file name."""
    pytest.importorskip("matplotlib")
    from cpkv.plots import figures as drawing
    from cpkv.plots import records, sweep

    caught: dict[str, object] = {}

    def keep(fig, path, legend=False):
        caught[Path(path).name] = fig
        return drawing.save(fig, path, legend)

    monkeypatch.setattr(records, "save", keep)
    monkeypatch.setattr(sweep, "save", keep)
    return caught
