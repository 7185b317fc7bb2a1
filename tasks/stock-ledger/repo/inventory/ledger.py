"""A per-warehouse stock ledger.

Every change of stock is recorded as a `Movement`, so the current quantity of
an item always equals the initial quantity plus the sum of its movements.
"""

from __future__ import annotations

from dataclasses import dataclass


class InsufficientStock(Exception):
    """Raised when shipping more units than the warehouse holds."""

    def __init__(self, warehouse: str, sku: str, wanted: int, available: int):
        super().__init__(f"{warehouse}: cannot ship {wanted} x {sku}, only {available} in stock")
        self.sku = sku
        self.wanted = wanted
        self.available = available


@dataclass(frozen=True)
class Movement:
    sku: str
    delta: int      # positive for receipts, negative for shipments
    reason: str


class Warehouse:
    def __init__(self, name: str, stock: dict[str, int] = {}):
        """Create a warehouse, optionally with initial stock (sku -> quantity)."""
        if any(qty < 0 for qty in stock.values()):
            raise ValueError("initial stock cannot be negative")
        self.name = name
        self._stock = stock
        self.history: list[Movement] = []

    def quantity(self, sku: str) -> int:
        return self._stock.get(sku, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy of the current stock, without items at zero."""
        return {sku: qty for sku, qty in sorted(self._stock.items()) if qty}

    def _move(self, sku: str, delta: int, reason: str) -> None:
        self._stock[sku] = self.quantity(sku) + delta
        self.history.append(Movement(sku, delta, reason))

    def receive(self, sku: str, qty: int, reason: str = "receipt") -> None:
        if qty <= 0:
            raise ValueError("quantity must be positive")
        self._move(sku, qty, reason)

    def ship(self, sku: str, qty: int, reason: str = "shipment") -> None:
        if qty <= 0:
            raise ValueError("quantity must be positive")
        available = self.quantity(sku)
        if qty > available:
            raise InsufficientStock(self.name, sku, qty, available)
        self._move(sku, -qty, reason)

    def value(self, prices: dict[str, float]) -> float:
        """Total stock value; items without a price are ignored."""
        return sum(qty * prices.get(sku, 0.0) for sku, qty in self._stock.items())


def transfer(source: Warehouse, target: Warehouse, sku: str, qty: int) -> None:
    """Move stock between warehouses; nothing changes if the source lacks it."""
    source.ship(sku, qty, reason=f"transfer to {target.name}")
    target.receive(sku, qty, reason=f"transfer from {source.name}")
