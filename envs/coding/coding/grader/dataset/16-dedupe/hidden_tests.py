import unittest

from unique import dedupe


class HiddenDedupeTest(unittest.TestCase):
    def test_empty(self):
        self.assertEqual(dedupe([]), [])

    def test_no_repeats_sorted(self):
        self.assertEqual(dedupe([1, 2, 3]), [1, 2, 3])

    def test_order_kept(self):
        self.assertEqual(dedupe([3, 1, 3, 2, 1]), [3, 1, 2])

    def test_strings(self):
        self.assertEqual(dedupe(["b", "a", "b", "c", "a"]), ["b", "a", "c"])
