from decimal import Decimal as D

import pytest

from invoicing import Invoice, allocate, to_cents


def test_to_cents_keeps_exact_amounts():
    assert to_cents("12.30") == D("12.30")
    assert to_cents(7) == D("7.00")


def test_to_cents_rounds_half_away_from_zero():
    assert to_cents("0.125") == D("0.13")
    assert to_cents("0.135") == D("0.14")
    assert to_cents("-0.125") == D("-0.13")


def test_allocate_spreads_leftover_cents():
    shares = allocate(D("10.00"), 3)
    assert shares == [D("3.34"), D("3.33"), D("3.33")]
    assert sum(shares) == D("10.00")
    with pytest.raises(ValueError):
        allocate(D("1"), 0)


def test_invoice_totals():
    inv = Invoice(tax_rate=D("0.20"))
    inv.add("pen", D("1.50"), 4)
    inv.add("paper", D("3.99"))
    assert inv.subtotal() == D("9.99")
    assert inv.tax() == D("2.00")
    assert inv.total() == D("11.99")


def test_invoice_tax_on_half_cent():
    inv = Invoice(tax_rate=D("0.10"))
    inv.add("sticker", D("1.25"))
    assert inv.tax() == D("0.13")
    assert inv.total() == D("1.38")
