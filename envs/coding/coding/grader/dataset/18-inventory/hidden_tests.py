import unittest

from store.errors import OutOfStock
from store.inventory import Inventory


class HiddenInventoryTest(unittest.TestCase):
    def test_add_and_count(self):
        inventory = Inventory()
        inventory.add("pen", 3)
        inventory.add("pen")
        self.assertEqual(inventory.count("pen"), 4)

    def test_remove_some(self):
        inventory = Inventory()
        inventory.add("pen", 3)
        inventory.remove("pen", 2)
        self.assertEqual(inventory.count("pen"), 1)

    def test_remove_too_many(self):
        inventory = Inventory()
        inventory.add("pen", 1)
        with self.assertRaises(OutOfStock):
            inventory.remove("pen", 2)
        self.assertEqual(inventory.count("pen"), 1)

    def test_remove_unknown(self):
        with self.assertRaises(OutOfStock):
            Inventory().remove("ink")

    def test_sold_out_items_disappear(self):
        inventory = Inventory()
        inventory.add("pen", 2)
        inventory.add("ink", 1)
        inventory.remove("pen", 2)
        self.assertEqual(inventory.items(), ["ink"])
