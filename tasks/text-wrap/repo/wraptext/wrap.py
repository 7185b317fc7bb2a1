"""Greedy word wrapping.

Words are separated by any run of whitespace. Every output line is at most
`width` characters long; a word longer than `width` is split into chunks of
exactly `width` characters.
"""

from __future__ import annotations


def _chunks(word: str, width: int) -> list[str]:
    return [word[i:i + width] for i in range(0, len(word), width)]


def wrap(text: str, width: int = 70) -> list[str]:
    """Wrap `text` into lines of at most `width` characters."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if len(word) > width:
            if current:
                lines.append(current)
            *full, current = _chunks(word, width)
            lines.extend(full)
        elif not current:
            current = word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int = 70) -> str:
    """Like `wrap`, but joined into a single string with newlines."""
    return "\n".join(wrap(text, width))


def indent(text: str, prefix: str, skip_blank: bool = True) -> str:
    """Add `prefix` to the start of every line (blank lines are left alone)."""
    out = []
    for line in text.splitlines(keepends=True):
        if skip_blank and not line.strip():
            out.append(line)
        else:
            out.append(prefix + line)
    return "".join(out)


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """Collapse whitespace and cut `text` at a word boundary to fit in `width`."""
    words = text.split()
    collapsed = " ".join(words)
    if len(collapsed) <= width:
        return collapsed
    kept = ""
    for word in words:
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) + len(placeholder) > width:
            break
        kept = candidate
    if not kept:
        return placeholder.strip()[:width]
    return kept + placeholder
