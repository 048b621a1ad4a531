"""A tiny deterministic experiment kind for sweep tests (registered only inside a fixture).

Rows: one per (tag, tick): tokens = 10 * scale * (tick + 1), budget_tokens = 100 - 10 * tick * scale.
``fail_on_scale``: the run raises at that scale (a failing point); ``scale < 0`` is a user error
caught in prepare (no run directory); ``needs_device: true`` cannot run here (prepare raises
UnsupportedError, as a CUDA config does on a machine without CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cpkv.core.errors import InputError, UnsupportedError
from cpkv.core.schema import positive
from cpkv.runs.results import RunOutput, metric, outcome


@dataclass(frozen=True)
class EchoBlock:
    ticks: int = 3
    scale: float = 1.0
    fail_on_scale: float | None = None
    tags: tuple[str, ...] = ("a",)
    needs_device: bool = False

    def validate(self) -> None:
        positive("ticks", self.ticks)


@dataclass(frozen=True)
class EchoConfig:
    kind: str = "sweeptest"
    name: str = "echo"
    seed: int = 0
    sweeptest: EchoBlock = field(default_factory=EchoBlock)


@dataclass(frozen=True)
class EchoRow:
    tag: str
    tick: int
    tokens: float = metric(unit="tokens", lower_is_better=False)
    budget_tokens: float = metric(unit="tokens")
    stopped_by: str = outcome()


def prepare(cfg: EchoConfig):
    block = cfg.sweeptest
    if block.scale < 0:
        raise InputError(f"sweeptest.scale: must be >= 0, got {block.scale}")
    if block.needs_device:
        raise UnsupportedError("sweeptest.needs_device: this machine has no such device")

    def execute(ctx):
        if block.fail_on_scale is not None and block.scale == block.fail_on_scale:
            raise RuntimeError(f"planted failure at scale {block.scale}")
        rows = [
            EchoRow(
                tag,
                t,
                10 * block.scale * (t + 1),
                100 - 10 * t * block.scale,
                "NO_TOKEN" if t % 2 else "OTHER",
            )
            for tag in block.tags
            for t in range(block.ticks)
        ]
        return RunOutput(rows=rows, summary={"rows": len(rows)})

    return execute


@pytest.fixture
def fake_kind():
    """Register kind ``sweeptest`` for one test, then remove it (KINDS is process-global)."""
    from cpkv.core.kinds import KINDS, KindSpec

    spec = KindSpec(name="sweeptest", command="(tests)", config=f"{__name__}:EchoConfig",
                    prepare=f"{__name__}:prepare", summary="sweep test kind", block="sweeptest")  # fmt: skip
    KINDS.register("sweeptest", spec)
    yield spec
    KINDS._entries.pop("sweeptest", None)
    KINDS._help.pop("sweeptest", None)
