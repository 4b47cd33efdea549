import unittest

from unique import dedupe


class DedupeTest(unittest.TestCase):
    def test_order(self):
        self.assertEqual(dedupe([3, 1, 3, 2]), [3, 1, 2])
