import unittest

from nesting import flatten


class HiddenFlattenTest(unittest.TestCase):
    def test_flat(self):
        self.assertEqual(flatten([1, 2]), [1, 2])

    def test_one_level(self):
        self.assertEqual(flatten([1, [2, 3], 4]), [1, 2, 3, 4])

    def test_deep(self):
        self.assertEqual(flatten([1, [2, [3, [4]]]]), [1, 2, 3, 4])

    def test_empty_lists(self):
        self.assertEqual(flatten([[], [[]], 5]), [5])
