"""Shared test helpers: independent models, fixtures and paths."""
