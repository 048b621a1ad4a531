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

from collections.abc import Iterable
from typing import Final

from cpkv.core.errors import ConfigError


class NewTokenRatio:
    """The tracker's state (:attr:`init_ratio`, :attr:`min_ratio`, :attr:`decay_per_step`,
    :attr:`current`, :attr:`retract_decode_steps`; equal trackers have equal fields); every
    transition returns a new value. A tracker also knows the decay path ``current`` lies on
    (:meth:`_path`): trackers that decayed from one value share it, so that its values are
    computed once."""

    def __init__(
        self,
        init_ratio: float = 0.7,
        min_ratio: float = 0.7 * 0.14,
        decay_per_step: float = (0.7 - 0.7 * 0.14) / 600,
        current: float = 0.7,
        retract_decode_steps: int = 20,
    ) -> None:
        self.init_ratio = init_ratio
        self.min_ratio = min_ratio
        self.decay_per_step = decay_per_step
        self.current = current
        self.retract_decode_steps = retract_decode_steps
        self._on: list[float] | None = None  # the decay path ``current`` lies on
        self._index = 0  # where on it

    def _fields(self) -> tuple[float, float, float, float, int]:
        return (
            self.init_ratio, self.min_ratio, self.decay_per_step, self.current,
            self.retract_decode_steps,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NewTokenRatio):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"NewTokenRatio(init_ratio={self.init_ratio!r}, min_ratio={self.min_ratio!r}, "
            f"decay_per_step={self.decay_per_step!r}, current={self.current!r}, "
            f"retract_decode_steps={self.retract_decode_steps!r})"
        )

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
        init = float(min(init_ratio * conservativeness, 1.0))
        floor = float(min(init * min_factor, 1.0))
        return cls(init, floor, (init - floor) / decay_steps, init, retract_decode_steps)

    def decayed(self) -> NewTokenRatio:
        """One decay step toward ``min_ratio`` (a value below it is lifted to it)."""
        return self._at(max(self.current - self.decay_per_step, self.min_ratio))

    def after_decode_steps(self, steps: int) -> NewTokenRatio:
        """After ``steps`` decode steps without retraction, as the scheduler takes them: a
        decay step each while above ``min_ratio`` (:meth:`decay_path`)."""
        if self.current <= self.min_ratio:
            return self  # (it stays there)
        path = self._path()
        index = self._index + steps
        _extend(path, index, self.min_ratio, self.decay_per_step)
        if index > len(path) - 1:
            index = len(path) - 1  # (the path ends at its first value <= min)
        new = self._at(path[index])
        new._on, new._index = path, index
        return new

    def _at(self, current: float) -> NewTokenRatio:
        """This tracker with ``current``."""
        return NewTokenRatio(
            self.init_ratio, self.min_ratio, self.decay_per_step, current,
            self.retract_decode_steps,
        )  # fmt: skip

    def decay_path(self, steps: int) -> list[float]:
        """``current`` after each of the next ``steps`` decode steps (:meth:`decayed` while
        above ``min_ratio``, then constant)."""
        path = self._path()
        index = self._index
        end = index + steps
        _extend(path, end, self.min_ratio, self.decay_per_step)
        ahead = path[index + 1 : end + 1]
        if len(ahead) < steps:
            ahead.extend([path[-1]] * (steps - len(ahead)))
        return ahead

    def _path(self) -> list[float]:
        """The decay path ``current`` lies on (:func:`_extend`; at :attr:`_index`): the path
        is shared by every tracker that decayed from the same value."""
        path = self._on
        if path is not None:
            return path
        key = (self.current, self.min_ratio, self.decay_per_step)
        found = _PATHS.get(key)
        if found is None:
            if len(_PATHS) >= _PATHS_KEPT:
                del _PATHS[next(iter(_PATHS))]  # (the oldest)
            found = _PATHS[key] = [self.current]
        self._on, self._index = found, 0
        return found

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


_PATHS: dict[tuple[float, float, float], list[float]] = {}
"""Decay paths by (first value, ``min_ratio``, ``decay_per_step``): the few last begun."""
_PATHS_KEPT: Final = 8


def _extend(path: list[float], last: int, floor: float, decay: float) -> None:
    """Extend the decay path ``path`` (its first value, then each decay step's, as
    :meth:`NewTokenRatio.decayed` takes it while above ``floor``) to index ``last``, or to its
    end: its first value at or below ``floor`` (or one a decay step leaves unchanged), after
    which it stays."""
    current = path[-1]
    for _ in range(last + 1 - len(path)):
        if not current > floor:
            return
        following = max(current - decay, floor)
        if following == current:
            return
        path.append(following)
        current = following
