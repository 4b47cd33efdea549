def chunks(items, size):
    """`items` split into consecutive lists of `size` items (the last may be shorter)."""
    return [items[start : start + size] for start in range(0, len(items) - size + 1, size)]
