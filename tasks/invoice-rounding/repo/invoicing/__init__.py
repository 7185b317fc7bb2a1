"""Invoices with exact decimal money arithmetic."""

from .money import Invoice, LineItem, allocate, to_cents

__all__ = ["Invoice", "LineItem", "allocate", "to_cents"]
