"""Where tests find the repository, its configs, the test data and ../shared."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
TEST_DATA = REPO / "tests" / "data"
SAVED_RUNS = TEST_DATA / "runs"
SHARED = REPO.parent / "shared"
MOONCAKE_TRACE = SHARED / "data" / "mooncake_synthetic_trace.jsonl"
