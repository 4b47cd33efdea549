import unittest

from search import find


class FindTest(unittest.TestCase):
    def test_last(self):
        self.assertEqual(find([1, 3, 5, 7], 7), 3)
