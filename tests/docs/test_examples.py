"""Every shell example in README.md and docs/*.md is run here or marked as not run.

A shell example is a fenced block whose info string is ``bash``, ``sh``, ``shell`` or
``console``, or an unlabelled block holding ``$ `` command lines. The line before the fence
(blank lines aside) may hold a marker:

* ``<!-- not run: REASON -->``: the block is not run (a GPU, a cluster, minutes of time, the
  oracle venv, files made by hand); the reason is required;
* ``<!-- run: timings vary -->``: the block runs, and numbers with a decimal point in its output
  are not compared (they are times measured on the machine that ran it).

A block marked ``<!-- not run: docs/PAGE.md runs the same commands ... -->`` must hold the commands
of a runnable block of that page and show a subset of its output (the README's walk is the
manual's, cut), so checking that block checks this one.

Any other block runs: either ``$ COMMAND`` lines, each followed by the output the page shows (or
some of its lines), or (a ``bash``/``sh`` block without ``$``) a script whose output is not
shown, which must succeed. The commands of one page run in order, in one temporary working
directory that looks like the repository root (its files linked, an empty ``experiments/``,
``../shared`` beside it), with ``cpkv`` and ``python`` being the current interpreter. Every line
of the shown output must appear, in order, in what the command printed (stdout and stderr
together; a page may leave lines out, with ``...`` or without): whitespace runs count as one
space; run directories' dates and times, ``cpkv ls``'s times and the progress lines' seconds are
ignored; the timing lines of a run (``note: timing:``, ``timing:``, ``duration_us:``) are
compared without their numbers. A run directory the page shows is, in later commands of the
page, the one this run made in its place. The exit status must be 2 where the output shows
``cpkv: error:``, 1 where it shows a regression verdict, 0 otherwise.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHARED = REPO.parent / "shared"
SHELL_LANGS = {"bash", "sh", "shell", "console"}
GUIDE_MAX_LINES = 300
COMMAND_TIMEOUT_S = 300

MARKER = re.compile(r"^<!--\s*(not run|run):\s*(.*?)\s*-->$")
RUN_OPTIONS = {"timings vary"}
RUN_DIR = re.compile(r"experiments/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}_[^\s/]+(?:/[^\s/]+)?")
TIMING_LINE = re.compile(r"^(note: timing:|timing: \{|duration_us:)")


@dataclass
class Command:
    text: str
    shown: list[str]


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]
    marker: tuple[str, str] | None
    commands: list[Command] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        lang = lines[i][3:].strip()
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        body = lines[i + 1 : end]
        prev = i - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        m = MARKER.match(lines[prev].strip()) if prev >= 0 else None
        marker = (m.group(1), m.group(2)) if m else None
        if lang in SHELL_LANGS or (lang == "" and any(x.startswith("$ ") for x in body)):
            commands = _commands(body)
            if not commands and lang in {"bash", "sh", "shell"} and any(x.strip() for x in body):
                commands = [Command("\n".join(body), [])]  # a script: no output shown
            blocks.append(Block(page, i + 1, lang, body, marker, commands))
        i = end + 1
    return blocks


def _commands(body: list[str]) -> list[Command]:
    commands: list[Command] = []
    i = 0
    while i < len(body):
        if not body[i].startswith("$ "):
            if commands:
                commands[-1].shown.append(body[i])
            i += 1
            continue
        text = body[i][2:]
        while text.endswith("\\") and i + 1 < len(body):
            i += 1
            text = text[:-1] + " " + body[i].strip()
        commands.append(Command(text, []))
        i += 1
    return commands


ALL_BLOCKS = [b for page in PAGES for b in _blocks(page)]
RUNNABLE = [b for b in ALL_BLOCKS if b.marker is None or b.marker[0] == "run"]


def test_every_shell_example_is_run_or_marked():
    problems = []
    for b in ALL_BLOCKS:
        if b.marker is None or b.marker[0] == "run":
            if not b.commands:
                problems.append(
                    f"{b.where}: nothing to run: write '$ COMMAND' lines "
                    "or mark the block '<!-- not run: REASON -->'"
                )
            first = next((x for x in b.body if x.strip()), "")
            if any(x.startswith("$ ") for x in b.body) and not first.startswith("$ "):
                problems.append(f"{b.where}: text before the first '$ ' command")
        if b.marker and b.marker[0] == "not run" and not b.marker[1]:
            problems.append(f"{b.where}: 'not run' needs a reason")
        if b.marker and b.marker[0] == "run":
            unknown = {o.strip() for o in b.marker[1].split(",")} - RUN_OPTIONS
            if unknown:
                problems.append(
                    f"{b.where}: unknown run options {sorted(unknown)}; known: {sorted(RUN_OPTIONS)}"
                )
    assert not problems, "\n".join(problems)


def test_readme_is_a_short_guide():
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= GUIDE_MAX_LINES, (
        f"README.md has {n} lines; the guide holds at most {GUIDE_MAX_LINES}"
    )


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub and MkDocs spell them."""
    out, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#+ (.*)$", line)):
            text = re.sub(r"[^\w\s-]", "", m.group(1).replace("`", "")).strip().lower()
            out.add(re.sub(r"[-\s]+", "-", text))
    return out


def test_readme_links_resolve():
    """mkdocs build --strict checks the links of docs/; this checks the README's."""
    problems = []
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        page = REPO / path if path else REPO / "README.md"
        if not page.exists():
            problems.append(f"README.md links to {target}: no such file")
        elif anchor and page.suffix == ".md" and anchor not in _anchors(page):
            problems.append(f"README.md links to {target}: no such heading")
    assert not problems, "\n".join(problems)


SAME_AS = re.compile(r"(docs/[\w.-]+\.md) runs the same commands")


def test_examples_marked_as_run_elsewhere_are():
    """A block marked 'not run: docs/PAGE.md runs the same commands ...' holds the commands of a
    block of that page, in order, and shows a subset of its output lines, in order: checking
    that block checks this one."""
    problems = []
    for b in ALL_BLOCKS:
        m = SAME_AS.search(b.marker[1]) if b.marker and b.marker[0] == "not run" else None
        if not m:
            continue
        others = [o for o in ALL_BLOCKS if o.page == REPO / m.group(1) and o in RUNNABLE]
        twin = next(
            (o for o in others if [c.text for c in o.commands] == [c.text for c in b.commands]),
            None,
        )
        if twin is None:
            problems.append(
                f"{b.where}: no runnable block of {m.group(1)} runs {[c.text for c in b.commands]}"
            )
            continue
        for mine, theirs in zip(b.commands, twin.commands, strict=True):
            problem = _match(mine.shown, theirs.shown)
            if problem:
                problems.append(f"{b.where} against {twin.where}: {problem}")
    assert not problems, "\n".join(problems)


def test_examples_exist():
    assert RUNNABLE, "no runnable example found"
    assert len(PAGES) > 2


# -- running ---------------------------------------------------------------------------------


def _norm(line: str, timings_vary: bool) -> str:
    line = RUN_DIR.sub(lambda m: _placeholder(m.group(0)), line)
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<datetime>", line)
    line = re.sub(r"\(\d+(\.\d+)?s\)", "(<t>s)", line)
    line = re.sub(r"eta \d+:\d\d", "eta <t>", line)
    if TIMING_LINE.match(line.strip()):
        line = re.sub(r"\d[\d,]*(\.\d+)?(e[+-]?\d+)?", "<n>", line)
    elif timings_vary:
        line = re.sub(r"(_us=)\d[\d.]*", r"\1<x>", line)  # a headline's time, however rounded
        line = re.sub(r"\d[\d,]*\.\d+", "<x>", line)
    line = re.sub(r"-{2,}", "--", line)
    return re.sub(r"\s+", " ", line).strip()


def _placeholder(path: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}_", "<date>/<time>_", path)


def _match(shown: list[str], actual: list[str]) -> str | None:
    """None when every line `shown` (blank lines and '...' aside) appears in `actual`, in order.

    The pages cut long outputs, with '...' or silently (a summary's few lines of interest), so
    the shown lines are a subsequence of the output, not a copy of it.
    """
    pos = 0
    for k, line in enumerate(shown):
        if not line or line == "...":
            continue
        try:
            pos = actual.index(line, pos) + 1
        except ValueError:
            near = difflib.get_close_matches(line, actual[pos:], n=1, cutoff=0.5)
            where = "anywhere" if line not in actual else "in this order (it comes earlier)"
            return (
                f"shown line {k + 1} not found {where}:\n  shown:  {line!r}\n"
                f"  nearest printed: {near[0] if near else None!r}"
            )
    return None


@dataclass
class PageRun:
    cwd: Path
    env: dict[str, str]
    paths: dict[str, str] = field(default_factory=dict)  # run directory shown -> the one made here
    done: set[int] = field(default_factory=set)


_RUNS: dict[Path, PageRun] = {}


def _page_run(page: Path, tmp_root: Path) -> PageRun:
    if page in _RUNS:
        return _RUNS[page]
    base = tmp_root / page.stem
    cwd = base / "repo"
    cwd.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in {".git", "experiments", "site"}:
            (cwd / entry.name).symlink_to(entry)
    (base / "shared").symlink_to(SHARED)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    for name, exe in {
        "cpkv": f'"{sys.executable}" -m cpkv',
        "python": f'"{sys.executable}"',
        "python3": f'"{sys.executable}"',
    }.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {exe} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        CPKV_PLOTS="0",
        COLUMNS="120",
        NO_COLOR="1",
    )
    env.pop("FORCE_COLOR", None)
    _RUNS[page] = PageRun(cwd, env)
    return _RUNS[page]


def _run_block(block: Block, run: PageRun, check: bool) -> None:
    timings_vary = block.marker is not None and "timings vary" in block.marker[1]
    for cmd in block.commands:
        text = cmd.text
        for shown_path, made in run.paths.items():
            text = text.replace(shown_path, made)
        proc = subprocess.run(
            ["bash", "-c", text],
            cwd=run.cwd,
            env=run.env,
            capture_output=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        out = proc.stdout.splitlines()
        # pair the run directories the page shows with those this run made, in order
        shown_dirs = list(
            dict.fromkeys(m.group(0) for line in cmd.shown for m in RUN_DIR.finditer(line))
        )
        made_dirs = list(dict.fromkeys(m.group(0) for line in out for m in RUN_DIR.finditer(line)))
        for d in shown_dirs:
            same = [m for m in made_dirs if _placeholder(m) == _placeholder(d)]
            if same and d not in run.paths:
                run.paths[d] = same[0]
                made_dirs.remove(same[0])
        if not check:
            continue
        context = f"{block.where}: $ {cmd.text}\n--- output ---\n{proc.stdout[-4000:]}"
        assert "Traceback (most recent call last)" not in proc.stdout, context
        shown_text = "\n".join(cmd.shown)
        want = (
            2 if "cpkv: error:" in shown_text else 1 if "verdict: REGRESSION" in shown_text else 0
        )
        if (
            "cpkv: interrupted" not in shown_text
            and "cannot write (file too large)" not in shown_text
        ):
            assert proc.returncode == want, (
                f"exit status {proc.returncode}, expected {want}\n{context}"
            )
        if cmd.shown:
            problem = _match(
                [_norm(x, timings_vary) for x in cmd.shown], [_norm(x, timings_vary) for x in out]
            )
            assert problem is None, f"{problem}\n{context}"


@pytest.fixture(scope="session")
def docs_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("docs_examples")


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_example(block: Block, docs_tmp: Path):
    if not (SHARED / "data").is_dir():
        pytest.skip(f"needs {SHARED}/data (the traces and GPU profiles beside the repository)")
    run = _page_run(block.page, docs_tmp)
    # the examples of a page build on each other (cpkv ls, cpkv diff): run the earlier ones first
    for i, earlier in enumerate(RUNNABLE):
        if earlier is block:
            break
        if earlier.page == block.page and i not in run.done:
            run.done.add(i)
            _run_block(earlier, run, check=False)
    run.done.add(RUNNABLE.index(block))
    _run_block(block, run, check=True)
