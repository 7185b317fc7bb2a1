"""A small parser for INI-style configuration text.

Supported syntax::

    # full-line comments start with '#' or ';'
    [section]
    key = value        ; trailing comments need a space before the marker
"""

from __future__ import annotations

from dataclasses import dataclass, field

COMMENT_PREFIXES = ("#", ";")
TRUE_WORDS = {"1", "yes", "true", "on"}
FALSE_WORDS = {"0", "no", "false", "off"}


class ConfigError(ValueError):
    """Malformed configuration text; `lineno` is 1-based."""

    def __init__(self, lineno: int, message: str):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


@dataclass
class Config:
    """Parsed configuration: section name -> {key: value}."""

    sections: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        return self.sections.get(section, {}).get(key, default)

    def getint(self, section: str, key: str, default: int = 0) -> int:
        value = self.get(section, key)
        return default if value is None else int(value)

    def getbool(self, section: str, key: str, default: bool = False) -> bool:
        value = self.get(section, key)
        if value is None:
            return default
        word = value.lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValueError(f"[{section}] {key}: not a boolean: {value!r}")


def _strip_comment(value: str) -> str:
    """Drop a trailing ' #' or ' ;' comment from a value."""
    for marker in (" #", " ;"):
        pos = value.find(marker)
        if pos != -1:
            value = value[:pos]
    return value.strip()


def parse(text: str) -> Config:
    """Parse configuration text; keys are lower-cased, values kept as strings."""
    config = Config()
    section = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(COMMENT_PREFIXES):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ConfigError(lineno, f"unterminated section header {line!r}")
            section = line[1:-1].strip()
            if not section:
                raise ConfigError(lineno, "empty section name")
            config.sections.setdefault(section, {})
            continue
        if section is None:
            raise ConfigError(lineno, "key outside of any section")
        if "=" not in line:
            raise ConfigError(lineno, f"expected 'key = value', got {line!r}")
        key, _, value = line.rpartition("=")
        key = key.strip().lower()
        if not key:
            raise ConfigError(lineno, "empty key")
        config.sections[section][key] = _strip_comment(value)
    return config
