"""The one error of loading settings."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and what would be right."""
