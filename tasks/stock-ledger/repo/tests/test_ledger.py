import pytest

from inventory import InsufficientStock, Movement, Warehouse, transfer


def test_receive_and_ship_record_history():
    w = Warehouse("main", {"bolt": 10})
    w.receive("bolt", 5)
    w.ship("bolt", 12, reason="order 17")
    assert w.quantity("bolt") == 3
    assert w.history == [Movement("bolt", 5, "receipt"), Movement("bolt", -12, "order 17")]


def test_cannot_ship_more_than_available():
    w = Warehouse("main", {"nut": 2})
    with pytest.raises(InsufficientStock) as err:
        w.ship("nut", 3)
    assert (err.value.wanted, err.value.available) == (3, 2)
    assert w.quantity("nut") == 2 and w.history == []
    with pytest.raises(ValueError):
        w.receive("nut", 0)


def test_transfer_between_warehouses():
    a = Warehouse("a", {"gear": 4})
    b = Warehouse("b", {"gear": 1})
    transfer(a, b, "gear", 3)
    assert (a.quantity("gear"), b.quantity("gear")) == (1, 4)
    with pytest.raises(InsufficientStock):
        transfer(a, b, "gear", 2)
    assert b.snapshot() == {"gear": 4}
    assert b.value({"gear": 2.5}) == 10.0


def test_warehouses_do_not_share_stock():
    north = Warehouse("north")
    south = Warehouse("south")
    north.receive("bolt", 100)
    assert south.quantity("bolt") == 0
    assert Warehouse("west").snapshot() == {}


def test_initial_stock_is_copied():
    initial = {"nut": 5}
    w = Warehouse("east", initial)
    w.ship("nut", 2)
    assert initial == {"nut": 5}
    assert w.quantity("nut") == 3
