"""Every case of the hostile-input matrix (:mod:`tests.hostile.cases`) through the real CLI.

Each case runs in a fresh folder with the files it names; it must end with the expected exit
code (2 for bad input), one ``cpkv: error:`` line naming the file, line or key, no traceback,
and nothing new in the folder: no run or sweep directory, no temporary file.
``benchmarks/hostile_matrix.py`` runs the same table as separate processes and adds the faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpkv.cli import app
from tests.hostile.cases import Case, all_cases, check, leftovers, stop_holders

CASES = all_cases()


def run_case(case: Case, folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("CPKV_PLOTS", "0")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        if case.setup is not None:
            case.setup(folder)
        before = {str(p.relative_to(folder)) for p in folder.rglob("*")}
        res = CliRunner().invoke(app, list(case.args), catch_exceptions=False)
    finally:
        stop_holders()
    return check(
        case,
        res.exit_code,
        res.stdout,
        res.stderr,
        leftovers(folder, before, case.keeps, case.gone),
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    problems = run_case(case, tmp_path / "case", monkeypatch)
    assert not problems, f"{case.name} ({' '.join(case.args)[:200]}): {problems}"


def test_the_matrix_covers_every_command() -> None:
    """The table reaches every command that reads user input (a new command needs cases)."""
    from cpkv.cli import command_index

    reached = {" ".join(a for a in c.args[:2] if not a.startswith(("-", "admit."))) for c in CASES}
    for name, _ in command_index(app):
        assert any(r == name or r.startswith(name.split()[0]) for r in reached), name
    assert len(CASES) >= 200
