"""Absurd sizes and precisions (:mod:`tests.hostile.bound_cases`) through the real CLI: each
must end with exit 2, one ``cpkv: error:`` line naming the key, file or field and the
bound, no traceback and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.bound_cases import NEEDS_PROFILE, PROFILE, Case, bound_cases
from tests.hostile.test_bad_input import run_case

CASES = bound_cases()
NO_PROFILE = pytest.mark.skipif(not PROFILE.is_file(), reason=f"{PROFILE} is not here")
PARAMS = [
    pytest.param(c, id=c.name, marks=NO_PROFILE if c.name in NEEDS_PROFILE else ()) for c in CASES
]


@pytest.mark.parametrize("case", PARAMS)
def test_absurd_value_is_one_line(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = run_case(case, tmp_path / "case", monkeypatch)
    assert not problems, f"{case.name} ({' '.join(case.args)[:200]}): {problems}"
