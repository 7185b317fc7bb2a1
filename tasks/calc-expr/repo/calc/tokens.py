"""Split an arithmetic expression into number, operator and parenthesis tokens."""

from __future__ import annotations

import re
from dataclasses import dataclass

TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
OPERATORS = "+-*/^"


class TokenizeError(ValueError):
    """The expression contains a character that is not part of the grammar."""


@dataclass(frozen=True)
class Token:
    kind: str   # "num", "op", "(" or ")"
    text: str
    pos: int

    @property
    def value(self) -> float:
        return float(self.text)


def tokenize(expression: str) -> list[Token]:
    tokens = []
    for match in TOKEN_RE.finditer(expression.rstrip()):
        number, other = match.groups()
        pos = match.start(1) if number else match.start(2)
        if number:
            tokens.append(Token("num", number, pos))
        elif other in OPERATORS:
            tokens.append(Token("op", other, pos))
        elif other in "()":
            tokens.append(Token(other, other, pos))
        else:
            raise TokenizeError(f"unexpected {other!r} at position {pos}")
    return tokens
