"""Track stock levels and movements across warehouses."""

from .ledger import InsufficientStock, Movement, Warehouse, transfer

__all__ = ["InsufficientStock", "Movement", "Warehouse", "transfer"]
