import unittest

from nesting import flatten


class FlattenTest(unittest.TestCase):
    def test_deep(self):
        self.assertEqual(flatten([1, [2, [3]]]), [1, 2, 3])
