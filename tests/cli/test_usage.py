"""Usage errors are one line and exit 2 (with "did you mean"); help texts name real keys."""

from __future__ import annotations

from typer.testing import CliRunner

from cpkv.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_an_unknown_command_is_one_line_and_exit_2() -> None:
    for args, expected in (
        (
            ("nope",),
            "cpkv: error: unknown command 'nope' (commands: admit, fit-cost, validate, sweep,",
        ),
        (("admti",), "cpkv: error: unknown command 'admti'; did you mean 'admit'?"),
        (
            ("alloc", "hots"),
            "cpkv: error: unknown command 'hots'; did you mean 'host'? (commands: host, l1)",
        ),
        (("trace", "stat"), "did you mean 'stats'?"),
    ):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1 and expected in res.output


def test_other_usage_errors_are_one_line_too() -> None:
    res = run("ls", "--nope")
    assert (
        res.exit_code == 2
        and res.output.strip() == "cpkv: error: No such option: --nope (see `cpkv ls --help`)"
    )
    res = run("diff", "a")
    assert (
        res.exit_code == 2
        and res.output.strip() == "cpkv: error: Missing argument 'B' (see `cpkv diff --help`)"
    )
    res = run("alloc")  # no arguments: the group's help, as before
    assert "Commands" in res.output and "host" in res.output


def test_help_examples_use_keys_of_their_command() -> None:
    for args, key in (
        (("alloc", "host"), "alloc_host."),
        (("alloc", "l1"), "alloc_l1."),
        (("admit",), "admit."),
    ):
        text = run(*args, "--help").output
        arg_help = text[text.index("Arguments:") : text.index("Options:")]
        assert key in arg_help and all(
            other not in arg_help
            for other in ("admit.page_size", "alloc_host.", "alloc_l1.")
            if not other.startswith(key)
        ), arg_help


def test_diff_help_describes_the_rank_test() -> None:
    text = " ".join(run("diff", "--help").output.split())
    assert "Mann-Whitney U" in text and "--alpha" in text and "--all" in text
    assert "p05..p95" not in text  # the old spread rule is gone from the help


def test_unknown_config_keys_and_names_suggest_the_close_one() -> None:
    from cpkv.core.config import load_config
    from cpkv.core.errors import ConfigError

    cases = {
        "alloc_host.pagesize=3": "alloc_host.pagesize: unknown key; did you mean 'page_size'?",
        "alloc_host.impls=[refrence]": "unknown value 'refrence'; did you mean 'reference'?",
        "alloc_host.protocol=wram": "unknown value 'wram'; did you mean 'warm'?",
        "alloc_host.zzz=1": "alloc_host.zzz: unknown key (allowed here:",
    }
    for override, message in cases.items():
        try:
            load_config("alloc_host", None, [override])
        except ConfigError as err:
            assert message in str(err), str(err)
        else:
            raise AssertionError(override)
    try:
        load_config("admit", None, ["admit.workload.source=jsnol"])
    except ConfigError as err:
        assert "did you mean 'jsonl'?" in str(err)


def test_small_mistakes_get_the_fix_in_their_line() -> None:
    for args, expected in (
        (("admit", "--format", "json"), "`cpkv show RUN --format json`"),
        (
            ("admit", "admit.schedule_policy=dedline"),
            "unknown policy 'dedline'; did you mean 'deadline'? (allowed: fcfs, lof, random, "
            "lpm, dfs-weight, hrrn, shortest-prefill-first; cpkv's own: deadline)",
        ),
        (("alloc", "host", "alloc_host.request_pages=8"), "got 8 (int); a list of one: [8]"),
    ):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1 and expected in res.output, res.output
    res = run("alloc", "host", "alloc_host.request_pages=abc")  # no list of one to offer
    assert res.exit_code == 2 and "a list of one" not in res.output


def test_version_names_the_engines_it_mirrors() -> None:
    from cpkv import MIRRORS, __version__

    res = run("--version")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0] == f"cpkv {__version__}"
    for engine, version, _what in MIRRORS:
        assert any(line.strip().startswith(f"mirrors {engine} {version}:") for line in lines)
    assert ("sglang", "0.5.23") in {(e, v) for e, v, _ in MIRRORS}


def test_help_names_the_engines_and_next_steps_that_run_from_a_checkout() -> None:
    from pathlib import Path

    from cpkv import MIRRORS
    from cpkv.cli import FIRST_STEPS

    res = run("--help")
    assert res.exit_code == 0
    for engine, version, _what in MIRRORS:
        assert f"{engine} {version}:" in res.output
    assert "vLLM" in res.output
    root = Path(__file__).resolve().parents[2]
    for command, _what in FIRST_STEPS:
        assert command in res.output
        for word in command.split()[2:]:
            if word.endswith(".yaml") and "*" not in word:
                assert (root / word).is_file(), word
    steps = [command.split()[1] for command, _ in FIRST_STEPS]
    assert {"capacity", "diff", "sweep"} <= set(steps)


def test_the_vllm_version_shown_is_the_models():
    from cpkv import MIRRORS
    from cpkv.vllm import VLLM_VERSION

    assert ("vllm", VLLM_VERSION) in {(e, v) for e, v, _ in MIRRORS}
