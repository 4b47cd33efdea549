import unittest

from store.errors import OutOfStock
from store.inventory import Inventory


class InventoryTest(unittest.TestCase):
    def test_too_many(self):
        inventory = Inventory()
        inventory.add("pen", 1)
        with self.assertRaises(OutOfStock):
            inventory.remove("pen", 2)
