"""Semantic versions (MAJOR.MINOR.PATCH[-PRERELEASE]) with SemVer 2.0 ordering.

Build metadata ("+build.5") is accepted and ignored for ordering.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

_VERSION_RE = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _identifier_key(identifier: str) -> tuple[int, int | str]:
    """Numeric identifiers sort numerically and before alphanumeric ones."""
    if identifier.isdigit():
        return (0, identifier)
    return (1, identifier)


@functools.total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION_RE.match(text.strip())
        if not match:
            raise ValueError(f"not a semantic version: {text!r}")
        major, minor, patch, pre, build = match.groups()
        prerelease = tuple(pre.split(".")) if pre else ()
        return cls(int(major), int(minor), int(patch), prerelease, build or "")

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text

    def _key(self) -> tuple:
        # A release has higher precedence than any of its pre-releases.
        pre = tuple(_identifier_key(part) for part in self.prerelease)
        return (self.major, self.minor, self.patch, not self.prerelease, pre)

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    def bump(self, part: str) -> Version:
        """Next release: part is 'major', 'minor' or 'patch'."""
        if part == "major":
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"unknown version part {part!r}")


def latest(versions: list[str], include_prereleases: bool = True) -> Version | None:
    """The highest version among `versions`, or None if there is none."""
    parsed = [Version.parse(v) for v in versions]
    if not include_prereleases:
        parsed = [v for v in parsed if not v.is_prerelease]
    return max(parsed, default=None)
