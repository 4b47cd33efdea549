TO_CELSIUS = {
    "C": lambda value: value,
    "F": lambda value: (value - 32) * 5 / 9,
    "K": lambda value: value - 273.15,
}
FROM_CELSIUS = {
    "C": lambda value: value,
    "F": lambda value: value * 9 / 5 + 32,
    "K": lambda value: value + 273.15,
}


def convert(value, source, target):
    """`value` in unit `source` converted to unit `target` ("C", "F" or "K")."""
    if source not in TO_CELSIUS or target not in FROM_CELSIUS:
        raise ValueError(f"cannot convert {source} to {target}")
    if source == target:
        return value
    return FROM_CELSIUS[target](TO_CELSIUS[source](value))
