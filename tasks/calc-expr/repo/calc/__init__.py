"""A tiny arithmetic expression evaluator."""

from .evaluator import evaluate, to_rpn
from .tokens import Token, TokenizeError, tokenize

__all__ = ["Token", "TokenizeError", "evaluate", "to_rpn", "tokenize"]
