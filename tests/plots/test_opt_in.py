"""Plots are opt-in: ``--plots`` / ``CPKV_PLOTS=1`` turn them on, ``--no-plots`` stays
accepted, the flag wins over the environment, and ``--plots`` without matplotlib is one line
and exit 2 before anything runs."""

from __future__ import annotations

import importlib.util

import pytest

from cpkv.runs.runner import plots_wanted

COMMANDS = (("admit",), ("alloc", "host"), ("alloc", "l1"), ("trace", "stats"),
            ("trace", "curve"), ("sweep",), ("capacity",))  # fmt: skip


def test_off_unless_the_flag_or_the_environment_says(monkeypatch) -> None:
    monkeypatch.delenv("CPKV_PLOTS", raising=False)
    assert plots_wanted() is False and plots_wanted(None) is False
    assert plots_wanted(True) is True
    for value, wanted in (("1", True), ("yes", True), ("ON", True), ("0", False), ("", False)):
        monkeypatch.setenv("CPKV_PLOTS", value)
        assert plots_wanted() is wanted, value
        assert plots_wanted(True) is True and plots_wanted(False) is False  # the flag wins


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_takes_both_flags(cli, command: tuple[str, ...]) -> None:
    res = cli(*command, "--help", output=False)
    assert res.exit_code == 0 and "--plots / --no-plots" in res.output
    if command[0] in ("admit", "alloc"):  # parsed, then the config printed: nothing runs
        for flag in ("--plots", "--no-plots"):
            res = cli(*command, flag, "--print-config")
            assert res.exit_code == 0, res.output
    assert cli.run_dirs() == []


def test_plots_without_matplotlib_is_an_error_before_the_run(cli, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    res = cli("admit", "--plots")
    assert res.exit_code == 2
    assert res.stderr.strip() == "cpkv: error: plots need matplotlib: pip install 'cpkv[plot]'"
    assert cli.run_dirs() == []
    assert cli("admit", "--no-plots").exit_code == 0  # without the flag the run goes ahead
