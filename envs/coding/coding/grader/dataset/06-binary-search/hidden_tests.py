import unittest

from search import find


class HiddenFindTest(unittest.TestCase):
    def test_middle(self):
        self.assertEqual(find([1, 3, 5, 7, 9], 5), 2)

    def test_first(self):
        self.assertEqual(find([1, 3, 5, 7], 1), 0)

    def test_last(self):
        self.assertEqual(find([1, 3, 5, 7], 7), 3)

    def test_single(self):
        self.assertEqual(find([4], 4), 0)

    def test_absent(self):
        self.assertEqual(find([1, 3, 5], 4), -1)

    def test_empty(self):
        self.assertEqual(find([], 1), -1)
