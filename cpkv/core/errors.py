"""Errors a user can cause. The CLI prints them on one line and exits with code 2."""

from __future__ import annotations


class CpkvError(Exception):
    """Base class: the message says what was wrong, where, and what is allowed."""


class ConfigError(CpkvError):
    """A config file, key, value or override is not acceptable."""


class InputError(CpkvError):
    """An input file (JSONL requests, a trace, a run directory) is not acceptable."""


class UnsupportedError(CpkvError):
    """The request is valid but cannot run here (no CUDA, sglang not installed, ...)."""


class OutputError(CpkvError):
    """An output file could not be written (disk full, file too large, read-only, ...)."""
