"""Run several ``cpkv`` commands in one process: ``python -P run_many.py OUT ARGS_JSON``.

``ARGS_JSON`` is a JSON list of argument lists; command ``i`` writes its run under ``OUT/i``,
and ``OUT/exit_codes.json`` gets each command's exit code. Used to run the same commands
from the compiled serving engine and from its sources (the environment decides which)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    out, commands = Path(sys.argv[1]), json.loads(sys.argv[2])
    from cpkv.cli import app
    from cpkv.native import status

    codes = []
    for i, args in enumerate(commands):
        try:
            app([*args, "-o", str(out / str(i))], prog_name="cpkv")
        except SystemExit as stop:  # (the command's exit, success included)
            codes.append(stop.code if isinstance(stop.code, int) else 1)
    (out / "exit_codes.json").write_text(json.dumps({"engine": status(), "codes": codes}))


if __name__ == "__main__":
    main()
