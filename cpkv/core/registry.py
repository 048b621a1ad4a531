"""String-keyed registries: the YAML name of a backend is its registry key.

Entries may be objects or lazy ``"module:attribute"`` strings, so that heavy imports
(torch, sglang) happen only when an entry is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from cpkv.core.errors import ConfigError
from cpkv.core.suggest import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of implementations, with clear errors for unknown names."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T | str] = {}
        self._help: dict[str, str] = {}
        self._aliases: dict[str, str] = {}

    def register(
        self,
        name: str,
        entry: T | str | None = None,
        *,
        help: str = "",
        aliases: tuple[str, ...] = (),
    ) -> Any:
        """Register ``entry`` under ``name``; without ``entry``, act as a decorator."""

        def add(obj: T | str) -> T | str:
            if name in self._entries or name in self._aliases:
                raise ValueError(f"{self.what} {name!r} registered twice")
            self._entries[name] = obj
            self._help[name] = help or _first_doc_line(obj)
            for alias in aliases:
                self._aliases[alias] = name
            return obj

        if entry is None:
            return add
        add(entry)
        return entry

    def names(self) -> list[str]:
        """The registered names, in registration order (aliases excluded)."""
        return list(self._entries)

    def help(self, name: str) -> str:
        return self._help[self.canonical(name)]

    def canonical(self, name: str) -> str:
        """The canonical name for ``name`` (resolving aliases); ConfigError if unknown."""
        if name in self._entries:
            return name
        if name in self._aliases:
            return self._aliases[name]
        hint = did_you_mean(name, self.allowed())
        raise ConfigError(
            f"unknown {self.what} {name!r}{hint} (allowed: {', '.join(self.allowed())})"
        )

    def allowed(self) -> list[str]:
        return self.names() + sorted(self._aliases)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, name: str) -> T:
        """The entry for ``name``, importing it first when it was registered lazily."""
        key = self.canonical(name)
        entry = self._entries[key]
        if isinstance(entry, str):
            entry = _import_ref(entry)
            self._entries[key] = entry
        return entry  # type: ignore[return-value]


def _import_ref(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _first_doc_line(obj: object) -> str:
    if isinstance(obj, str):
        return ""
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def lazy(ref: str) -> Callable[..., Any]:
    """A callable that imports ``module:attribute`` on first call and forwards to it."""
    target: list[Any] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not target:
            target.append(_import_ref(ref))
        return target[0](*args, **kwargs)

    return call
