def ordinal(number):
    """`number` (a positive integer) as an English ordinal: 1st, 2nd, 3rd, 4th, ..."""
    if number % 100 in (11, 12, 13):
        return f"{number}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"
