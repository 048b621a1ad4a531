"""Check a sweep's points before anything runs (``cpkv sweep --dry-run``).

Planning already validated every point's config. Checking goes one step further: it runs each
point's *prepare* (:mod:`cpkv.core.kinds`), which is where a kind reads its input files,
resolves its device and imports its optional packages, and reports what would fail or be
skipped, without creating anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cpkv.core.errors import CpkvError, UnsupportedError
from cpkv.sweep.plan import Point

OK, SKIP, FAIL = "ok", "skip", "FAIL"


@dataclass(frozen=True)
class PointCheck:
    """``status``: ok (would run), skip (cannot run on this machine) or FAIL; ``reason`` says why."""

    point: Point
    status: str
    reason: str | None = None
    seconds: float = 0.0


def check_point(point: Point) -> PointCheck:
    """Run ``point``'s prepare and throw its result away (a user error or a missing device
    becomes the check's status)."""
    start = time.perf_counter()
    try:
        loaded = point.loaded()
        loaded.spec.prepare_fn()(loaded.experiment)
    except UnsupportedError as err:
        return PointCheck(point, SKIP, str(err), time.perf_counter() - start)
    except CpkvError as err:
        return PointCheck(point, FAIL, str(err), time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - a bug in one kind's prepare fails that point only
        return PointCheck(point, FAIL, f"{type(err).__name__}: {err}", time.perf_counter() - start)
    return PointCheck(point, OK, None, time.perf_counter() - start)
