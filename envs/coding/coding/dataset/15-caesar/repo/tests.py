import unittest

from cipher import shift


class ShiftTest(unittest.TestCase):
    def test_wrap(self):
        self.assertEqual(shift("xyz", 3), "abc")
