"""``admit.cost.kind: linear`` gives the results of the code before the roofline model.

Runs the serving configs of a base commit (default ``2ff6807``, the last commit with only the
linear model) with that commit's code, and the same config files with the working tree's code
and ``admit.cost.kind=linear``, then compares: the result rows, ``requests.jsonl``, every
timeline key the base wrote (the working tree adds the time breakdown), and the summary (the
working tree adds ``time`` and a ``kind`` in ``cost_model``). Exit 0 when all are identical.

    python benchmarks/linear_identity.py [--base 2ff6807]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = (
    ("configs/serving.yaml", False),
    ("configs/admit/serving_mooncake.yaml", False),
    ("configs/sweeps/serving_load.yaml", True),
)


def run(code: Path, config: Path, extra: list[str], out: str, sweep: bool) -> list[Path]:
    env = {**os.environ, "PYTHONPATH": str(code), "CPKV_PLOTS": "0", "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-P", "-m", "cpkv", "sweep" if sweep else "admit", str(config), *extra]
    proc = subprocess.run([*cmd, "-o", out], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return sorted(p.parent for p in Path(out).rglob("results.json"))


def compare(a: Path, b: Path) -> list[str]:
    problems = []
    ja = json.loads((a / "results.json").read_text())
    jb = json.loads((b / "results.json").read_text())
    if ja["rows"] != jb["rows"]:
        problems.append("rows differ")
    if (a / "requests.jsonl").read_bytes() != (b / "requests.jsonl").read_bytes():
        problems.append("requests.jsonl differs")
    ta = [json.loads(x) for x in (a / "timeline.jsonl").read_text().splitlines()]
    tb = [json.loads(x) for x in (b / "timeline.jsonl").read_text().splitlines()]
    if len(ta) != len(tb) or any({k: q[k] for k in p} != p for p, q in zip(ta, tb, strict=False)):
        problems.append("timeline.jsonl differs in the base's keys")
    sa, sb = ja["summary"], jb["summary"]
    for key, value in sa.items():
        if key == "timing" or key.endswith("_us"):
            continue
        theirs = sb.get(key)
        if key == "cost_model" and isinstance(theirs, dict):
            theirs = {k: v for k, v in theirs.items() if k != "kind"}
        if value != theirs:
            problems.append(f"summary {key} differs")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="2ff6807")
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="cpkv-linear-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            for rel, sweep in CONFIGS:
                config = base / rel  # the base's own file: linear coefficients, no kind
                ra = run(base, config, [], f"{tmp}/a", sweep)
                rb = run(ROOT, config, ["admit.cost.kind=linear"], f"{tmp}/b", sweep)
                for a, b in zip(ra, rb, strict=True):
                    problems = compare(a, b)
                    failures += bool(problems)
                    print(f"{'same ' if not problems else 'DIFF '} {rel} {a.name}", *problems)
                subprocess.run(["rm", "-rf", f"{tmp}/a", f"{tmp}/b"], check=True)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False, capture_output=True,
            )  # fmt: skip
    print("identical" if not failures else f"{failures} run(s) differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
