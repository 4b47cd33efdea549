import unittest

from stats_util import median


class MedianTest(unittest.TestCase):
    def test_sorted_odd(self):
        self.assertEqual(median([1, 2, 3]), 2)
