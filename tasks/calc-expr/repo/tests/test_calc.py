import pytest

from calc import TokenizeError, evaluate, to_rpn, tokenize


def rpn(expression):
    return " ".join(tok.text for tok in to_rpn(tokenize(expression)))


def test_tokenize():
    tokens = tokenize(" 12.5*(3 +4)")
    assert [t.text for t in tokens] == ["12.5", "*", "(", "3", "+", "4", ")"]
    assert [t.pos for t in tokens][:3] == [1, 5, 6]
    with pytest.raises(TokenizeError):
        tokenize("2 $ 3")


def test_precedence_and_parentheses():
    assert evaluate("2 + 3 * 4") == 14
    assert evaluate("(2 + 3) * 4") == 20
    assert evaluate("2 * 3 ^ 2") == 18


def test_left_associative_operators():
    assert rpn("8 - 3 - 2") == "8 3 - 2 -"
    assert evaluate("8 - 3 - 2") == 3
    assert evaluate("64 / 8 / 2") == 4


def test_power_is_right_associative():
    assert evaluate("2 ^ 3 ^ 2") == 512


def test_syntax_errors():
    for bad in ["(1 + 2", "1 + 2)", "1 +", ""]:
        with pytest.raises(SyntaxError):
            evaluate(bad)
