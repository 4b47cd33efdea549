import unittest

from intervals import merge


class HiddenMergeTest(unittest.TestCase):
    def test_overlap(self):
        self.assertEqual(merge([(1, 3), (2, 6)]), [(1, 6)])

    def test_disjoint(self):
        self.assertEqual(merge([(1, 2), (5, 6)]), [(1, 2), (5, 6)])

    def test_unsorted(self):
        self.assertEqual(merge([(8, 10), (1, 3), (2, 4)]), [(1, 4), (8, 10)])

    def test_touching(self):
        self.assertEqual(merge([(1, 2), (2, 3)]), [(1, 3)])

    def test_contained(self):
        self.assertEqual(merge([(1, 10), (2, 3)]), [(1, 10)])

    def test_empty(self):
        self.assertEqual(merge([]), [])
