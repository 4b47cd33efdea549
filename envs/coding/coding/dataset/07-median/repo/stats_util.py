def median(values):
    """The median of `values` (a non-empty list of numbers, in any order)."""
    middle = len(values) // 2
    return values[middle]
