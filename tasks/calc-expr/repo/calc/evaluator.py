"""Evaluate token lists with the shunting-yard algorithm.

`+ -` bind weaker than `* /`, which bind weaker than `^`. All operators are
left-associative except `^`, which is right-associative.
"""

from __future__ import annotations

import operator

from .tokens import Token, tokenize

PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}
RIGHT_ASSOCIATIVE = {"^"}
APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul,
         "/": operator.truediv, "^": operator.pow}


def _pops_before(top: str, op: str) -> bool:
    """Whether the operator `top` on the stack must be output before pushing `op`."""
    if top == "(":
        return False
    if PRECEDENCE[top] != PRECEDENCE[op]:
        return PRECEDENCE[top] > PRECEDENCE[op]
    return op in RIGHT_ASSOCIATIVE


def to_rpn(tokens: list[Token]) -> list[Token]:
    """Reorder infix tokens into reverse Polish notation."""
    output: list[Token] = []
    stack: list[Token] = []
    for tok in tokens:
        if tok.kind == "num":
            output.append(tok)
        elif tok.kind == "op":
            while stack and _pops_before(stack[-1].text, tok.text):
                output.append(stack.pop())
            stack.append(tok)
        elif tok.kind == "(":
            stack.append(tok)
        else:
            while stack and stack[-1].kind != "(":
                output.append(stack.pop())
            if not stack:
                raise SyntaxError(f"unbalanced ')' at position {tok.pos}")
            stack.pop()
    while stack:
        tok = stack.pop()
        if tok.kind == "(":
            raise SyntaxError(f"unbalanced '(' at position {tok.pos}")
        output.append(tok)
    return output


def evaluate(expression: str) -> float:
    """Evaluate an infix expression such as '2 * (3 + 4) ^ 2'."""
    values: list[float] = []
    for tok in to_rpn(tokenize(expression)):
        if tok.kind == "num":
            values.append(tok.value)
            continue
        if len(values) < 2:
            raise SyntaxError(f"operator {tok.text!r} at position {tok.pos} lacks an operand")
        right = values.pop()
        values.append(APPLY[tok.text](values.pop(), right))
    if len(values) != 1:
        raise SyntaxError("expression does not reduce to a single value")
    return values[0]
