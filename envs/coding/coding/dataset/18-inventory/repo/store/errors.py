class OutOfStock(Exception):
    """More of an item was asked for than the inventory holds."""
