def chunks(items, size):
    """`items` split into consecutive lists of `size` items (the last may be shorter)."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[start : start + size] for start in range(0, len(items), size)]
