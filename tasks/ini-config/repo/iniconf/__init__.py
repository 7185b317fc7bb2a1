"""Parse small INI-style configuration files."""

from .parser import Config, ConfigError, parse

__all__ = ["Config", "ConfigError", "parse"]
