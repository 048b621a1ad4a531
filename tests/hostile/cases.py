"""The hostile-input matrix: bad input to every command, each with what cpkv must answer.

One table serves two runners: ``tests/hostile/test_bad_input.py`` runs every case through the
real CLI in-process (fast, in CI) and ``benchmarks/hostile_matrix.py`` runs each as a separate
``python -m cpkv`` process (the exit code and stderr a user sees) together with the fault
cases (full disk, signals, concurrent sweeps) and prints the counts.

A case is a folder of files (``files``, written fresh for each run, plus ``setup`` for things a
file cannot hold: a finished run, a held lock), a ``cpkv`` command line run in that folder, and
what must come out: the exit code (2 for bad input), one line on stderr naming the file, line
or key (``expect``: every string must appear in it), no traceback, no run or sweep directory
and no temporary file left in the folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUT = "out"  # the output root of the commands that write (``-o out``)


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...] = ()  # substrings of the one stderr line
    code: int = 2
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    stdout_has: tuple[str, ...] = ()  # for cases that succeed (code 0) and must say something
    keeps: tuple[str, ...] = ()  # paths the setup made that may stay (runs read back)
    gone: tuple[str, ...] = ()  # paths the setup made that the command must remove


# -- building blocks -------------------------------------------------------------------------

TRACE_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
TRACE = {"t.jsonl": TRACE_LINE * 3}


@dataclass(frozen=True)
class Command:
    """A command that takes a config: how to call it, its kind and a key of each type."""

    label: str
    prefix: tuple[str, ...]  # before the config file
    kind: str
    block: str
    int_key: str  # a dotted key holding an integer >= 0 (or > 0)
    float_key: str  # a dotted key holding a number
    float_is_list: bool = False
    files: dict[str, str] = field(default_factory=dict)


COMMANDS = (
    Command("admit", ("admit",), "admit", "admit", "admit.available_tokens", "admit.new_token_ratio"),
    Command("alloc-host", ("alloc", "host"), "alloc_host", "alloc_host", "alloc_host.page_size",
            "alloc_host.host_sizes_gb", float_is_list=True),
    Command("alloc-l1", ("alloc", "l1"), "alloc_l1", "alloc_l1", "alloc_l1.cp_size",
            "alloc_l1.free_room_ratio"),
    Command("trace-stats", ("trace", "stats", "t.jsonl"), "trace_stats", "trace",
            "trace.block_size", "trace.cache.hicache_ratio", files=TRACE),
    Command("trace-curve", ("trace", "curve", "t.jsonl"), "trace_curve", "trace",
            "trace.block_size", "curve.fractions", float_is_list=True, files=TRACE),
    Command("sweep", ("sweep",), "admit", "admit", "admit.available_tokens", "admit.new_token_ratio"),
)  # fmt: skip


def nested(dotted: str, value: str) -> str:
    """``a.b.c`` = value as block YAML."""
    parts = dotted.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}")
    return "\n".join(lines) + "\n"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _output_args(cmd: Command) -> tuple[str, ...]:
    return ("-o", OUT)


def config_cases(cmd: Command) -> list[Case]:
    """Bad config files for one command."""
    head = f"kind: {cmd.kind}\nname: hostile\n"

    def case(tag: str, text: str | bytes, *expect: str, arg: str = "c.yaml") -> Case:
        files = {**cmd.files, "c.yaml": text} if arg == "c.yaml" else dict(cmd.files)
        return Case(f"{cmd.label}/config/{tag}", (*cmd.prefix, arg, *_output_args(cmd)),
                    expect, files=files)  # fmt: skip

    bad_float = "[.nan]" if cmd.float_is_list else ".nan"
    inf_float = "[.inf]" if cmd.float_is_list else "-.inf"
    out = [
        case("missing-file", "", "nothing.yaml", "not found", arg="nothing.yaml"),
        Case(f"{cmd.label}/config/a-directory", (*cmd.prefix, "adir.yaml", *_output_args(cmd)),
             ("adir.yaml", "directory"), files={**cmd.files, "adir.yaml/keep": ""}),  # fmt: skip
        case("not-utf8", head.encode() + b"name: \xff\xfe\n", "c.yaml", "not UTF-8", "offset"),
        case("invalid-yaml", head + "admit: [1, 2\n", "c.yaml", "invalid YAML"),
        case("duplicate-key", head + "seed: 1\nseed: 2\n", "c.yaml:4", "duplicate key 'seed'", "line 3"),
        case("duplicate-nested-key", head + f"{cmd.block}:\n  x: 1\n  x: 2\n", "c.yaml:5", "duplicate key 'x'"),
        case("alias-bomb", head + alias_bomb(), "c.yaml", "aliases are expanded"),
        case("deep-nesting", head + "x: " + "[" * 20000 + "]" * 20000 + "\n", "c.yaml", "nested"),
        case("deep-block-nesting", head + "".join(f"{'  ' * i}k{i}:\n" for i in range(60)) + "  " * 60 + "v: 1\n",
             "c.yaml", "nested"),
        case("too-large", head + "# " + "x" * (2 << 20) + "\n", "c.yaml", "too large"),
        case("two-documents", head + "---\n" + head, "c.yaml", "more than one YAML document"),
        case("a-list", "- kind\n- admit\n", "c.yaml", "expected a mapping"),
        case("a-scalar", "42\n", "c.yaml", "expected a mapping"),
        case("unknown-kind", "kind: nonsense\n", "c.yaml", "kind", "nonsense"),
        case("kind-not-a-string", "kind: [admit]\n", "c.yaml", "kind"),
        case("unknown-top-key", head + "colour: red\n", "c.yaml", "colour", "unknown key"),
        case("unknown-nested-key", head + nested(f"{cmd.block}.nonexist", "1"), "c.yaml", "nonexist", "unknown key"),
        case("wrong-type", head + nested(cmd.int_key, "lots"), "c.yaml", cmd.int_key.split(".")[-1]),
        case("negative-size", head + nested(cmd.int_key, "-5"), "c.yaml", cmd.int_key.split(".")[-1]),
        case("nan", head + nested(cmd.float_key, bad_float), "c.yaml", cmd.float_key.split(".")[-1]),
        case("infinity", head + nested(cmd.float_key, inf_float), "c.yaml", cmd.float_key.split(".")[-1]),
        case("seed-overflow", head.replace("name: hostile\n", "name: hostile\nseed: 99999999999999999999999\n"),
             "c.yaml", "seed"),
        case("interpolation-resolver", head + "x: ${oc.env:HOME}\n", "c.yaml", "interpolation"),
        case("interpolation-of-a-list", head + "x: [1, 2]\ny: ${x}\n", "c.yaml", "interpolation"),
        case("python-tag", head + "x: !!python/object/apply:os.system [echo hi]\n", "c.yaml", "invalid YAML"),
        case("null-key", head + "? [a, b]\n: 1\n", "c.yaml"),
    ]  # fmt: skip
    if cmd.label != "sweep":
        out.append(case("sweep-block", head + "sweep:\n  seed: [1, 2]\n", "c.yaml:3", "cpkv sweep"))
        other = "alloc_l1" if cmd.kind != "alloc_l1" else "alloc_host"
        out.append(case("wrong-kind", f"kind: {other}\n", "c.yaml", f"kind is '{other}'"))
    return out


def override_cases(cmd: Command) -> list[Case]:
    """Bad KEY=VALUE overrides for one command (the config file is valid)."""
    files = {**cmd.files, "c.yaml": f"kind: {cmd.kind}\nname: hostile\n"}

    def case(tag: str, *items: str, expect: tuple[str, ...]) -> Case:
        return Case(f"{cmd.label}/override/{tag}", (*cmd.prefix, "c.yaml", *items, *_output_args(cmd)),
                    expect, files=files)  # fmt: skip

    k, f = cmd.int_key, cmd.float_key
    bomb = "[" + ", ".join(
        [f"&a [{','.join(['1'] * 10)}]"]
        + [f"&{c} [{','.join([f'*{p}'] * 10)}]" for p, c in zip("abcd", "bcde", strict=True)]
    ) + "]"  # fmt: skip
    nan = "[nan]" if cmd.float_is_list else "nan"
    out = [
        case("malformed-key", "a..b=1", expect=("'a..b=1'", "malformed key")),
        case("trailing-dot", f"{cmd.block}.=1", expect=(f"'{cmd.block}.=1'", "malformed key")),
        case("empty-key", "=1", expect=("'=1'", "KEY=VALUE")),
        case("unknown-nested-key", f"{cmd.block}.nonexist.x=1", expect=(f"'{cmd.block}.nonexist.x=1'", "unknown key")),
        case("invalid-value", f"{k}=[1", expect=(f"'{k}=[1'",)),
        case("alias-bomb-value", f"{k}={bomb}", expect=(f"'{k}=", "aliases are expanded")),
        case("deep-value", f"{k}=" + "[" * 5000 + "]" * 5000, expect=(f"'{k}=",)),
        case("nan-value", f"{f}={nan}", expect=(f"'{f}={nan}'",)),
        case("wrong-type", f"{k}=lots", expect=(f"'{k}=lots'",)),
        case("kind", "kind=alloc_l1" if cmd.kind != "alloc_l1" else "kind=admit", expect=("kind",)),
        case("interpolation", f"{cmd.block}.x=${{oc.env:HOME}}", expect=(f"{cmd.block}.x",)),
    ]  # fmt: skip
    if cmd.label != "sweep":
        out.append(case("two-configs", "other.yaml", expect=("one config file per run",)))
        out.append(case("sweep-key", "sweep=1", expect=("sweep",)))
    return out


# -- sizes that cannot fit ------------------------------------------------------------------


def size_cases() -> list[Case]:
    def case(tag: str, prefix: tuple[str, ...], items: str, *expect: str) -> Case:
        return Case(f"size/{tag}", (*prefix, *items.split(" "), "-o", OUT), expect)

    host, l1, admit = ("alloc", "host"), ("alloc", "l1"), ("admit",)
    return [
        case("host-pages", host, "alloc_host.host_pages=[1e12]", "host_pages", "GiB"),
        case("host-sizes-gb", host, "alloc_host.host_sizes_gb=[1e300]", "host_sizes_gb"),
        case("host-sizes-gb-inf", host, "alloc_host.host_sizes_gb=[inf]", "host_sizes_gb"),
        case("host-page-size", host, "alloc_host.host_sizes_gb=[] alloc_host.host_pages=[1000000] "
             "alloc_host.page_size=1e9", "host_pages", "page_size", "GiB"),
        case("l1-physical-pages", l1, "alloc_l1.physical_pages=[1e12]", "physical_pages", "GiB"),
        case("l1-cp-size", l1, "alloc_l1.cp_size=1e9", "cp_size", "GiB"),
        case("l1-page-size", l1, "alloc_l1.page_size=1e15", "page_size", "int64"),
        case("admit-synthetic-count", admit,
             "admit.workload.source=synthetic admit.workload.synthetic.count=1e12", "count", "GiB"),
        case("write-workload-count", admit, "--write-workload w.jsonl admit.workload.source=synthetic "
             "admit.workload.synthetic.count=1e12", "count", "GiB"),
        case("admit-grid", admit, " ".join(
            f"admit.workload.grid.{key}=[{','.join(map(str, range(1, 2001)))}]"
            for key in ("l1_cached_tokens", "l2_cached_tokens", "extend_tokens")), "grid", "GiB"),
    ]  # fmt: skip


# -- input files: requests, traces, cost points -------------------------------------------


@dataclass(frozen=True)
class Reader:
    label: str
    prefix: tuple[str, ...]  # arguments before the file
    suffix: tuple[str, ...]  # after it
    good: str  # a valid line
    field: str  # a numeric field of a line
    writes: bool = True  # takes -o


READERS = (
    Reader("jsonl-requests", ("admit", "admit.workload.source=jsonl"), (),
           '{"rid": "r0", "extend_tokens": 8}', "extend_tokens"),
    Reader("trace-stats", ("trace", "stats"), (), TRACE_LINE.strip(), "input_length"),
    Reader("trace-curve", ("trace", "curve"), (), TRACE_LINE.strip(), "input_length"),
    Reader("admit-trace", ("admit", "admit.workload.source=trace"), (), TRACE_LINE.strip(), "input_length"),
    Reader("fit-cost", ("fit-cost",), (), '{"prefill_tokens": 10, "time_us": 100}', "time_us", writes=False),
    Reader("fit-points", ("admit", "admit.mode=serving"), (), '{"prefill_tokens": 10, "time_us": 100}',
           "time_us"),
)  # fmt: skip


def _file_arg(reader: Reader, name: str) -> tuple[str, ...]:
    if reader.label in ("jsonl-requests", "admit-trace"):
        return (f"admit.workload.path={name}",)
    if reader.label == "fit-points":
        return ("admit.cost.kind=linear", f"admit.cost.fit_points={name}")
    return (name,)


def input_cases(reader: Reader) -> list[Case]:
    def case(tag: str, text: str | bytes | None, *expect: str, name: str = "in.jsonl") -> Case:
        files = {} if text is None else {name: text}
        args = (*reader.prefix, *_file_arg(reader, name), *reader.suffix)
        if reader.writes:
            args = (*args, "-o", OUT)
        return Case(f"{reader.label}/input/{tag}", args, expect, files=files)

    good = reader.good
    obj = json.loads(good)
    k = reader.field
    with_value = lambda v: json.dumps({**obj, k: v})  # noqa: E731
    return [
        case("missing-file", None, "in.jsonl"),
        Case(f"{reader.label}/input/a-directory",
             (*reader.prefix, *_file_arg(reader, "adir"), *(("-o", OUT) if reader.writes else ())),
             ("adir",), files={"adir/keep": ""}),  # fmt: skip
        case("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "in.jsonl", "not UTF-8", "offset"),
        case("not-utf8-line-3", (good + "\n" + good + "\n").encode() + b'{"x": "\xc3\x28"}\n', "in.jsonl",
             "not UTF-8", "offset"),
        case("empty", "", "in.jsonl"),
        case("invalid-json", good + "\n{not json\n", "in.jsonl:2", "JSON"),
        case("not-an-object", good + "\n[1, 2]\n", "in.jsonl:2"),
        case("deep-json", good + "\n" + "[" * 100000 + "]" * 100000 + "\n", "in.jsonl:2"),
        case("nan", with_value(float("nan")) + "\n", "in.jsonl:1", k),
        case("infinity", with_value(float("inf")) + "\n", "in.jsonl:1", k),
        case("negative", with_value(-1) + "\n", "in.jsonl:1", k),
        case("string", with_value("ten") + "\n", "in.jsonl:1", k),
        case("bool", with_value(True) + "\n", "in.jsonl:1", k),
        case("unknown-field", json.dumps({**obj, "colour": 1}) + "\n", "in.jsonl:1", "colour")
        if reader.label not in ("trace-stats", "trace-curve", "admit-trace") else
        case("hash-count", json.dumps({**obj, "hash_ids": [1, 2, 3]}) + "\n", "in.jsonl:1", "hash_ids"),
        case("missing-field", json.dumps({x: v for x, v in obj.items() if x != k}) + "\n", "in.jsonl:1", k),
    ]  # fmt: skip


def fit_overflow_cases() -> list[Case]:
    rows = [
        {"prefill_tokens": 1e300 * (i + 1), "decode_requests": i, "time_us": 1e300}
        for i in range(8)
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    return [
        Case("fit-cost/input/overflow", ("fit-cost", "p.jsonl"), ("p.jsonl:1", "prefill_tokens", "2**53"),
             files={"p.jsonl": text}),
        Case("fit-cost/input/kv-bytes-zero", ("fit-cost", "p.jsonl", "--kv-bytes-per-token", "0"),
             ("--kv-bytes-per-token",), files={"p.jsonl": '{"time_us": 1}\n'}),
    ]  # fmt: skip


# -- saved runs and sweeps: show, diff, ls, plot, resume ------------------------------------


_TEMPLATES: dict[tuple, Path] = {}


def _template(key: tuple, make: Callable[[Path], Path]) -> Path:
    """A run or sweep made once per process (in a temporary folder removed at exit), copied
    into each case that needs one: cases stay independent and cheap."""
    if key not in _TEMPLATES:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="cpkv-hostile-template-"))
        atexit.register(shutil.rmtree, folder, True)
        _TEMPLATES[key] = make(folder)
    return _TEMPLATES[key]


def _copy(template: Path, target: Path) -> Path:
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(template, target)
    return target


def make_run(folder: Path, name: str = "good", overrides: tuple[str, ...] = ()) -> Path:
    """A finished admit run under ``folder/runs/<day>/`` (made through the Python API once,
    then copied)."""

    def make(where: Path) -> Path:
        from cpkv.core.config import load_config
        from cpkv.runs.runner import run_experiment

        loaded = load_config("admit", None, [f"name={name}", *overrides])
        return run_experiment(loaded, where / "runs", argv=["cpkv"], plots=False).path

    template = _template(("run", name, overrides), make)
    return _copy(template, folder / "runs" / template.parent.name / template.name)


def damaged(what: str, text: str | bytes) -> Callable[[Path], None]:
    """A setup: a finished run whose file ``what`` is replaced by ``text``; the run goes to
    ``folder/bad`` (and a good run beside it under ``folder/runs``)."""

    def setup(folder: Path) -> None:
        import shutil

        make_run(folder)
        bad = make_run(folder, "bad")
        target = folder / "bad"
        shutil.move(str(bad), target)
        data = text.encode() if isinstance(text, str) else text
        (target / what).write_bytes(data)

    return setup


def serving_pair(folder: Path) -> None:
    """Two serving runs: goodput null in ``a`` (nothing finishes), a number in ``b``."""
    import shutil

    a = make_run(folder, "a", ("admit.mode=serving", "admit.kv.capacity_blocks=1"))
    b = make_run(folder, "b", ("admit.mode=serving", "admit.kv.capacity_blocks=100000"))
    shutil.move(str(a), folder / "a")
    shutil.move(str(b), folder / "b")


def sweep_dir(folder: Path) -> None:
    """A finished 2-point sweep at ``folder/sw``."""

    def make(where: Path) -> Path:
        from cpkv.sweep import run_sweep

        (where / "s.yaml").write_text("kind: admit\nname: s\nsweep:\n  admit.page_size: [1, 16]\n")
        return run_sweep([str(where / "s.yaml")], root=where / "runs", argv=["cpkv"]).path

    _copy(_template(("sweep",), make), folder / "sw")


def held_sweep(folder: Path) -> None:
    """A sweep at ``folder/sw`` whose lock another process holds (a child that sleeps)."""
    import subprocess
    import sys
    import time

    sweep_dir(folder)
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
        'fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.pwrite(fd, b\'{"pid": 4242, "host": "elsewhere"}\', 0);'
        "print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder / "sw" / "sweep.lock"), "60"],
                              stdout=subprocess.PIPE)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
    HOLDERS.append(holder)
    time.sleep(0.05)


HOLDERS: list = []  # lock-holding child processes, ended by the runner after each case


def stop_holders() -> None:
    while HOLDERS:
        proc = HOLDERS.pop()
        proc.kill()
        proc.wait()


def saved_cases() -> list[Case]:
    results_rows_not_list = json.dumps({"schema_version": 1, "kind": "admit", "name": "x",
        "columns": {"identity": [], "metrics": [], "timing": [], "outcomes": []}, "summary": {},
        "rows": "all of them"})  # fmt: skip
    corrupt = {
        "rows-not-a-list": ("results.json", results_rows_not_list, "results.json", "rows"),
        "results-not-json": ("results.json", "{oops", "results.json", "JSON"),
        "results-binary": ("results.json", b"\xff\xfe\x00", "results.json", "not UTF-8"),
        "results-deep": ("results.json", "[" * 100000 + "]" * 100000, "results.json"),
        "results-future": ("results.json", json.dumps({"schema_version": 99}), "results.json", "99"),
        "meta-not-json": ("meta.json", "{", "meta.json", "JSON"),
        "meta-a-list": ("meta.json", "[]", "meta.json"),
        "config-invalid": ("config.yaml", "a: [1\n", "config.yaml", "invalid YAML"),
        "config-bomb": ("config.yaml", alias_bomb(), "config.yaml", "aliases"),
    }  # fmt: skip
    out = []
    for tag, (what, text, *expect) in corrupt.items():
        setup = damaged(what, text)
        if what != "config.yaml":  # show and plot do not read config.yaml
            out.append(Case(f"show/corrupt/{tag}", ("show", "bad"), tuple(expect), setup=setup))
            out.append(Case(f"plot/corrupt/{tag}", ("plot", "bad"), tuple(expect), setup=setup))
        out.append(
            Case(
                f"diff/corrupt/{tag}",
                ("diff", "runs", "bad"),
                tuple(expect),
                setup=_diff_setup(setup),
            )
        )
        out.append(
            Case(
                f"ls/corrupt/{tag}",
                ("ls", "."),
                code=0,
                setup=setup,
                stdout_has=("corrupt", "complete"),
            )
        )
    huge = json.dumps({"schema_version": 1, "kind": "admit", "name": "x", "summary": {},
        "columns": {"identity": [], "metrics": ["x"], "timing": [], "outcomes": []},
        "table_columns": ["x"], "rows": [{"x": "HUGE"}]}).replace('"HUGE"', "9" * 400)  # fmt: skip
    out += [
        Case(
            "show/huge-int",
            ("show", "bad"),
            code=0,
            setup=damaged("results.json", huge),
            stdout_has=("999",),
        ),
        Case(
            "ls/huge-int",
            ("ls", "."),
            code=0,
            setup=damaged("results.json", huge),
            stdout_has=("complete",),
        ),
    ]
    out += [
        Case("show/missing", ("show", "nothing"), ("nothing", "no such directory")),
        Case("show/not-a-run", ("show", "adir"), ("adir",), files={"adir/keep": ""}),
        Case("show/bad-format", ("show", "bad", "--format", "yaml"), ("--format",), setup=damaged("notes", "")),
        Case("show/bad-columns", ("show", "bad", "--columns", "nope"), ("nope",), setup=damaged("notes", "")),
        Case("show/sweep-summary-corrupt", ("show", "sw"), ("sw", "summary.json"), setup=_then(sweep_dir, "sw/summary.json", "[1]")),
        Case("ls/missing-root", ("ls", "nothing"), ("nothing",)),
        Case("ls/sweep-plan-corrupt", ("ls", "."), code=0, setup=_then(sweep_dir, "sw/sweep.yaml", "points: {"),
             stdout_has=("corrupt",)),
        Case("diff/null-vs-number", ("diff", "a", "b"), code=0, setup=serving_pair, stdout_has=("goodput_requests_per_s", "n/a")),
        Case("diff/threshold-not-a-number", ("diff", "a", "b", "--threshold", "p50_us:abc"), ("p50_us:abc",), setup=serving_pair),
        Case("diff/threshold-negative", ("diff", "a", "b", "-t", "timing:-5"), ("timing:-5",), setup=serving_pair),
        Case("diff/threshold-nan", ("diff", "a", "b", "-t", "timing:nan"), ("timing:nan",), setup=serving_pair),
        Case("diff/run-vs-sweep", ("diff", "a", "sw"), ("sw", "sweep"), setup=_both(serving_pair, sweep_dir)),
        Case("diff/unknown-metric", ("diff", "a", "b", "--metric", "nope"), ("nope",), setup=serving_pair),
        Case("resume/not-a-sweep", ("sweep", "--resume", "adir"), ("adir", "sweep.yaml"), files={"adir/keep": ""}),
        Case("resume/plan-corrupt", ("sweep", "--resume", "sw"), ("sweep.yaml",), setup=_then(sweep_dir, "sw/sweep.yaml", "sweep_version: 1\npoints: 5\n")),
        Case("resume/plan-bomb", ("sweep", "--resume", "sw"), ("sweep.yaml", "aliases"), setup=_then(sweep_dir, "sw/sweep.yaml", alias_bomb(12, 9))),
        Case("resume/point-name-escapes", ("sweep", "--resume", "sw"), ("sweep.yaml", "directory name"),
             setup=_edit_plan(lambda doc: doc["points"][0].update(name="../../elsewhere"))),
        Case("resume/locked", ("sweep", "--resume", "sw"), ("sw", "another cpkv sweep", "pid 4242", "elsewhere"),
             setup=held_sweep),
        Case("resume/with-configs", ("sweep", "--resume", "sw", "c.yaml"), ("--resume",), setup=sweep_dir, files={"c.yaml": "kind: admit\n"}),
    ]  # fmt: skip
    return out


def _then(setup: Callable[[Path], None], path: str, text: str) -> Callable[[Path], None]:
    def both(folder: Path) -> None:
        setup(folder)
        (folder / path).write_text(text)

    return both


def _both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        for s in setups:
            s(folder)

    return run


def _diff_setup(setup: Callable[[Path], None]) -> Callable[[Path], None]:
    """``setup``, then ``runs`` becomes the good run itself (diff compares two run dirs)."""

    def run(folder: Path) -> None:
        import shutil

        setup(folder)
        (good,) = list((folder / "runs").rglob("meta.json"))
        shutil.move(str(good.parent), folder / "good")
        shutil.rmtree(folder / "runs")
        shutil.move(str(folder / "good"), folder / "runs")

    return run


def _edit_plan(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        import yaml

        sweep_dir(folder)
        plan = folder / "sw" / "sweep.yaml"
        doc = yaml.safe_load(plan.read_text())
        edit(doc)
        plan.write_text(yaml.safe_dump(doc, sort_keys=False))

    return run


# -- the sweep command itself, and arguments ------------------------------------------------


def sweep_cases() -> list[Case]:
    ok = {"c.yaml": "kind: admit\nname: s\n"}
    return [
        Case("sweep/no-config", ("sweep", "-o", OUT), ("config",)),
        Case("sweep/bad-grid-value", ("sweep", "g.yaml", "-o", OUT), ("g.yaml:4", "available_tokens"),
             files={"g.yaml": "kind: admit\nname: s\nsweep:\n  admit.available_tokens: [100, -5]\n"}),
        Case("sweep/unknown-override-key", ("sweep", "c.yaml", "alloc_l1.cp_size=1,2", "-o", OUT), ("alloc_l1.cp_size",), files=ok),
        Case("sweep/bad-zip", ("sweep", "c.yaml", "--zip", "a,b", "-o", OUT), ("--zip",), files=ok),
        Case("sweep/bad-range", ("sweep", "c.yaml", "seed=range(1,x)", "-o", OUT), ("seed",), files=ok),
        Case("sweep/ray-address-without-ray", ("sweep", "c.yaml", "--ray-address", "127.0.0.1:1", "-o", OUT),
             ("--ray-address",), files=ok),
        Case("sweep/ray-address-malformed", ("sweep", "c.yaml", "--executor", "ray", "--ray-address", "head-node", "-o", OUT),
             ("head-node", "HOST:PORT"), files=ok),
        Case("sweep/unknown-executor", ("sweep", "c.yaml", "--executor", "slurm", "-o", OUT), ("slurm",), files=ok),
        Case("sweep/point-too-large", ("sweep", "c.yaml", "admit.workload.source=synthetic",
             "admit.workload.synthetic.count=1000,1000000000000", "-o", OUT), ("count", "GiB"), files=ok),
        Case("admit/output-root-is-a-file", ("admit", "-o", "afile"), ("afile",), files={"afile": "x"}),
        Case("admit/write-workload-to-a-directory", ("admit", "--write-workload", "adir"), ("adir",), files={"adir/keep": ""}),
        Case("admit/run-dir-as-config", ("admit", "run=1"), ("run=1", "config.yaml"), files={"run=1/config.yaml": "kind: admit\n", "run=1/meta.json": "{}"}),
        Case("trace/two-traces", ("trace", "stats", "t.jsonl", "u.jsonl", "-o", OUT), ("one trace",), files={**TRACE, "u.jsonl": TRACE_LINE}),
        Case("trace/no-trace", ("trace", "stats", "-o", OUT), ("trace.path",)),
    ]  # fmt: skip


SERVING = (
    "kind: admit\nname: s\nadmit:\n  mode: serving\n  arrivals: {process: poisson, rate_rps: 2}\n"
    "  slo: {ttft_ms: 1000}\n"
)
"""A serving config a capacity search accepts (the grid's 8 requests, Poisson arrivals)."""


def capacity_cases() -> list[Case]:
    ok = {"c.yaml": SERVING}
    return [
        Case("capacity/no-config", ("capacity", "-o", OUT), ("name one config file",)),
        Case("capacity/passes-mode", ("capacity", "c.yaml", "admit.mode=passes", "-o", OUT), ("admit.mode is 'passes'",), files=ok),
        Case("capacity/no-slo", ("capacity", "c.yaml", "admit.slo.ttft_ms=null", "-o", OUT), ("admit.slo sets no limit",), files=ok),
        Case("capacity/zero-arrivals", ("capacity", "c.yaml", "admit.arrivals.process=zero", "-o", OUT), ("no load to search",), files=ok),
        Case("capacity/other-kind", ("capacity", "h.yaml", "-o", OUT), ("h.yaml", "kind is 'alloc_host'"), files={"h.yaml": "kind: alloc_host\n"}),
        Case("capacity/two-axes", ("capacity", "c.yaml", "seed=1,2", "admit.policy=conservative,optimistic", "-o", OUT), ("one second axis",), files=ok),
        Case("capacity/load-as-axis", ("capacity", "c.yaml", "admit.arrivals.rate_rps=1,2", "-o", OUT), ("load the search varies",), files=ok),
        Case("capacity/bad-block", ("capacity", "b.yaml", "-o", OUT), ("b.yaml:8", "capacity.tolerance"),
             files={"b.yaml": SERVING + "capacity:\n  tolerance: 0\n"}),
        Case("capacity/bad-flag", ("capacity", "c.yaml", "--growth", "1", "-o", OUT), ("--growth 1",), files=ok),
        Case("capacity/max-requests-of-a-grid", ("capacity", "c.yaml", "--max-requests", "4", "-o", OUT), ("max_requests",), files=ok),
        Case("capacity/missing-workload", ("capacity", "c.yaml", "admit.workload.source=jsonl", "admit.workload.path=none.jsonl", "-o", OUT),
             ("none.jsonl",), files=ok),
        Case("capacity/unknown-executor", ("capacity", "c.yaml", "--executor", "slurm", "-o", OUT), ("slurm",), files=ok),
        Case("capacity/resume-not-a-search", ("capacity", "--resume", "adir"), ("adir", "capacity.yaml"), files={"adir/keep": ""}),
        Case("capacity/resume-corrupt", ("capacity", "--resume", "adir"), ("capacity.yaml",),
             files={"adir/capacity.yaml": "capacity_version: 1\nvalues: 3\n", "adir/sweep.yaml": "sweep_version: 1\n"}),
        Case("capacity/resume-a-sweep", ("capacity", "--resume", "sw"), ("sw", "capacity.yaml"), setup=sweep_dir),
        Case("capacity/cluster-too-large", ("capacity", "c.yaml", "admit.cluster.instances=1,5000", "-o", OUT),
             ("admit.cluster.instances", "[1, 4096]"), files=ok),
    ]  # fmt: skip


VALID_CASE = (
    "name: c\nsource: s\nsetup: s\nbatch: 2\nprompt_tokens: 8\noutput_tokens: 4\n"
    "published: {latency_ms: 10}\n"
)


def validate_cases() -> list[Case]:
    """``cpkv validate``: its cases are YAML files read with the config bounds."""
    return [
        Case("validate/missing", ("validate", "nope.yaml"), ("nope.yaml", "no such file")),
        Case("validate/empty-folder", ("validate", "cases"), ("cases", "holds no validation case"),
             setup=lambda f: (f / "cases").mkdir()),
        Case("validate/not-yaml", ("validate", "c.yaml"), ("c.yaml",), files={"c.yaml": "a: [1\n"}),
        Case("validate/unknown-key", ("validate", "c.yaml"), ("c.yaml", "colour", "unknown key"),
             files={"c.yaml": VALID_CASE + "colour: red\n"}),
        Case("validate/wrong-type", ("validate", "c.yaml"), ("c.yaml", "batch"),
             files={"c.yaml": VALID_CASE.replace("batch: 2", "batch: two")}),
        Case("validate/negative", ("validate", "c.yaml"), ("c.yaml", "published.latency_ms", "> 0"),
             files={"c.yaml": VALID_CASE.replace("latency_ms: 10", "latency_ms: -10")}),
        Case("validate/unknown-metric", ("validate", "c.yaml"), ("c.yaml", "published", "speed"),
             files={"c.yaml": VALID_CASE.replace("latency_ms: 10", "speed: 10")}),
        Case("validate/no-source", ("validate", "c.yaml"), ("c.yaml", "source", "must say it"),
             files={"c.yaml": VALID_CASE.replace("source: s\n", "")}),
        Case("validate/cost-key", ("validate", "c.yaml"), ("c.yaml", "cost.tp", ">= 1"),
             files={"c.yaml": VALID_CASE + "cost: {tp: 0}\n"}),
        Case("validate/format", ("validate", "--format", "html", "c.yaml"), ("--format", "html"),
             files={"c.yaml": VALID_CASE}),
        Case("validate/ok", ("validate", "c.yaml"), code=0, files={"c.yaml": VALID_CASE},
             stdout_has=("1 published numbers",)),
    ]  # fmt: skip


def all_cases() -> list[Case]:
    cases: list[Case] = []
    for cmd in COMMANDS:
        cases += config_cases(cmd) + override_cases(cmd)
    cases += size_cases()
    for reader in READERS:
        cases += input_cases(reader)
    cases += fit_overflow_cases() + saved_cases() + sweep_cases() + capacity_cases()
    cases += validate_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


# -- checking an outcome --------------------------------------------------------------------


def leftovers(
    folder: Path, before: set[str], keeps: tuple[str, ...] = (), gone: tuple[str, ...] = ()
) -> list[str]:
    """Files and folders the command left in ``folder`` that were not there before it ran:
    run or sweep directories, temporary files (``.x.tmp-PID``, ``x.tmp``), anything else;
    and those of ``gone`` (stale files it had to remove) that are still there."""
    now = {str(p.relative_to(folder)) for p in folder.rglob("*")}
    new = sorted(now - before)
    kept = [p for p in new if not any(p == k or p.startswith(k + "/") for k in keeps)]
    return kept + [p for p in gone if (folder / p).exists()]


def check(case: Case, code: int, stdout: str, stderr: str, left: list[str]) -> list[str]:
    """What is wrong with one outcome (empty: the case passed)."""
    problems = []
    text = stdout + stderr
    if "Traceback" in text or "╭─" in text:
        problems.append("traceback")
    if code != case.code:
        problems.append(f"exit {code}, expected {case.code}")
    lines = [line for line in stderr.splitlines() if line.strip()]
    if case.code == 2:
        if len(lines) != 1 or not lines[0].startswith("cpkv: error: "):
            problems.append(f"stderr is not one 'cpkv: error:' line: {stderr[:300]!r}")
        else:
            missing = [e for e in case.expect if e not in lines[0]]
            if missing:
                problems.append(f"error line lacks {missing}: {lines[0][:300]!r}")
    for want in case.stdout_has:
        if want not in stdout:
            problems.append(f"stdout lacks {want!r}")
    if left:
        problems.append(f"left behind: {left[:5]}")
    return problems
