"""Money helpers and a minimal invoice model.

All amounts are `Decimal`. Results are rounded to whole cents with commercial
rounding: an amount of exactly half a cent rounds away from zero
(0.125 -> 0.13, -0.125 -> -0.13).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal

CENT = Decimal("0.01")


def to_cents(amount: Decimal | int | str) -> Decimal:
    """Round `amount` to two decimal places using commercial rounding."""
    return Decimal(amount).quantize(CENT, rounding=ROUND_HALF_EVEN)


def allocate(amount: Decimal, parts: int) -> list[Decimal]:
    """Split `amount` into `parts` shares that differ by at most one cent.

    The shares always add up to `to_cents(amount)`; leftover cents go to the
    first shares.
    """
    if parts <= 0:
        raise ValueError("parts must be positive")
    total_cents = int(to_cents(amount) / CENT)
    base, extra = divmod(total_cents, parts)
    return [(base + (1 if i < extra else 0)) * CENT for i in range(parts)]


@dataclass(frozen=True)
class LineItem:
    """One invoice line: `quantity` units at `unit_price` each."""

    description: str
    unit_price: Decimal
    quantity: int = 1

    def amount(self) -> Decimal:
        return to_cents(self.unit_price * self.quantity)


@dataclass
class Invoice:
    """A list of line items with a single tax rate (e.g. Decimal('0.20'))."""

    tax_rate: Decimal = Decimal("0")
    items: list[LineItem] = field(default_factory=list)

    def add(self, description: str, unit_price: Decimal, quantity: int = 1) -> LineItem:
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        item = LineItem(description, Decimal(unit_price), quantity)
        self.items.append(item)
        return item

    def subtotal(self) -> Decimal:
        return sum((item.amount() for item in self.items), Decimal("0.00"))

    def tax(self) -> Decimal:
        return to_cents(self.subtotal() * self.tax_rate)

    def total(self) -> Decimal:
        return self.subtotal() + self.tax()
