import unittest

from stats_util import median


class HiddenMedianTest(unittest.TestCase):
    def test_sorted_odd(self):
        self.assertEqual(median([1, 2, 3]), 2)

    def test_single(self):
        self.assertEqual(median([7]), 7)

    def test_unsorted_odd(self):
        self.assertEqual(median([9, 1, 5]), 5)

    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_unsorted_even(self):
        self.assertEqual(median([10, 2, 8, 4]), 6)
