"""Read a run's JSON outputs as a strict reader does: NaN and Infinity are not JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def strict_json(text: str, where: str) -> Any:
    """``text`` parsed; AssertionError naming ``where`` for NaN, Infinity or -Infinity."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{where} holds {constant}")

    return json.loads(text, parse_constant=refuse)


def read_outputs(run: Path) -> dict[str, Any]:
    """Every ``.json`` file of ``run`` (its tree) as a document and every ``.jsonl`` file as
    its lines' documents, by file name, all parsed strictly."""
    docs: dict[str, Any] = {}
    for file in sorted(run.rglob("*")):
        if file.suffix == ".json":
            docs[file.name] = strict_json(file.read_text(), str(file))
        elif file.suffix == ".jsonl":
            docs[file.name] = [
                strict_json(line, f"{file}:{k}")
                for k, line in enumerate(file.read_text().splitlines(), 1)
            ]
    return docs
