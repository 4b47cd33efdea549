VALUES = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(number):
    """`number` (1 to 3999) as a Roman numeral."""
    if not 1 <= number <= 3999:
        raise ValueError("Roman numerals go from 1 to 3999")
    parts = []
    for value, letters in VALUES:
        while number >= value:
            parts.append(letters)
            number -= value
    return "".join(parts)
