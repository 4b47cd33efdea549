from store.errors import OutOfStock


class Inventory:
    """How many of each item a shop holds."""

    def __init__(self):
        self._counts = {}

    def add(self, name, count=1):
        self._counts[name] = self._counts.get(name, 0) + count

    def remove(self, name, count=1):
        held = self._counts.get(name, 0)
        if count > held:
            raise OutOfStock(f"{name}: {held} held, {count} asked for")
        if count == held:
            del self._counts[name]
        else:
            self._counts[name] = held - count

    def count(self, name):
        return self._counts.get(name, 0)

    def items(self):
        return sorted(self._counts)
