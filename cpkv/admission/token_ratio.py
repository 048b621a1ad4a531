"""SGLang's adaptive ``new_token_ratio``: how much of ``max_new_tokens`` to budget for.

PrefillAdder charges each running request ``min(max_new - generated, 4096) * ratio`` of
future KV; this module tracks ``ratio`` the way sglang 0.5.23 does
(``managers/scheduler_components/new_token_ratio_tracker.py`` and the decode path of
``Scheduler.update_running_batch``), as an immutable value:

* ``init = min(init_ratio * conservativeness, 1)``, ``min = min(init * min_factor, 1)``,
  ``decay = (init - min) / decay_steps`` (defaults 0.7, 1.0, 0.14, 600: the env vars
  ``SGLANG_INIT_NEW_TOKEN_RATIO``, ``--schedule-conservativeness``,
  ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``);
* :meth:`NewTokenRatio.decayed` - once per decode step that needed no retraction:
  ``current = max(current - decay, min)``;
* :meth:`NewTokenRatio.retracted` - after a decode step retracted requests:
  ``current = min(1, (sum generated + retract_decode_steps * n) / (sum max_new + 1))``
  over the ``n`` requests that *stay* in the running batch (not the retracted ones).
  The value is set as is, even below ``min``; the next decay step lifts it to ``min``;
* :meth:`NewTokenRatio.reset` - when the scheduler is fully idle (nothing running,
  nothing waiting, no chunked request): ``current = init``.

A decode step whose batch is empty (all finished) neither decays nor resets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cpkv.core.errors import ConfigError


@dataclass(frozen=True)
class NewTokenRatio:
    """The tracker's state; every transition returns a new value."""

    init_ratio: float = 0.7
    min_ratio: float = 0.7 * 0.14
    decay_per_step: float = (0.7 - 0.7 * 0.14) / 600
    current: float = 0.7
    retract_decode_steps: int = 20

    @classmethod
    def from_settings(
        cls,
        init_ratio: float = 0.7,
        conservativeness: float = 1.0,
        min_factor: float = 0.14,
        decay_steps: int = 600,
        retract_decode_steps: int = 20,
    ) -> NewTokenRatio:
        """SGLang's derivation of init/min/decay from its settings (names as in the docstring)."""
        for name, value in (
            ("init_ratio", init_ratio),
            ("conservativeness", conservativeness),
            ("min_factor", min_factor),
        ):
            if value < 0:
                raise ConfigError(f"new_token_ratio {name} must be >= 0, got {value}")
        if decay_steps < 1 or retract_decode_steps < 0:
            raise ConfigError(
                f"new_token_ratio decay_steps must be >= 1 and retract_decode_steps >= 0, got {decay_steps} and {retract_decode_steps}"
            )
        init = min(init_ratio * conservativeness, 1.0)
        floor = min(init * min_factor, 1.0)
        return cls(init, floor, (init - floor) / decay_steps, init, retract_decode_steps)

    def decayed(self) -> NewTokenRatio:
        """One decay step toward ``min_ratio`` (a value below it is lifted to it)."""
        return self._at(max(self.current - self.decay_per_step, self.min_ratio))

    def after_decode_steps(self, steps: int) -> NewTokenRatio:
        """After ``steps`` decode steps without retraction, as the scheduler takes them: a
        decay step each while above ``min_ratio`` (:meth:`decay_path`)."""
        current = self.current
        if current <= self.min_ratio:
            return self  # (it stays there)
        for current in self.decay_path(steps):  # noqa: B007 - the last value is the one
            if current <= self.min_ratio:
                break
        return self._at(current)

    def _at(self, current: float) -> NewTokenRatio:
        """This tracker with ``current`` (``dataclasses.replace`` without its checks: the
        engine takes a step every iteration)."""
        new = object.__new__(NewTokenRatio)
        new.__dict__.update(self.__dict__, current=current)
        return new

    def decay_path(self, steps: int) -> Iterator[float]:
        """``current`` after each of the next ``steps`` decode steps (:meth:`decayed` while
        above ``min_ratio``, then constant)."""
        current, floor, decay = self.current, self.min_ratio, self.decay_per_step
        for _ in range(steps):
            if current > floor:
                current = max(current - decay, floor)
            yield current

    def reset(self) -> NewTokenRatio:
        """When the scheduler is fully idle: back to ``init_ratio``."""
        return self._at(self.init_ratio)

    def retracted(self, kept: Iterable[tuple[int, int]]) -> NewTokenRatio:
        """After a retraction; ``kept`` = (generated_tokens, max_new_tokens) of requests still running."""
        return self._at(self.estimate_after_retract(kept))

    def estimate_after_retract(self, kept: Iterable[tuple[int, int]]) -> float:
        """``min(1, (sum generated + retract_decode_steps * n) / (sum max_new + 1))``."""
        kept = list(kept)
        generated = sum(g for g, _ in kept)
        max_new = sum(m for _, m in kept)
        return min(1.0, (generated + self.retract_decode_steps * len(kept)) / (max_new + 1))
