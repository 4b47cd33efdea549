import unittest

from calendar_rules import is_leap


class LeapTest(unittest.TestCase):
    def test_ordinary(self):
        self.assertTrue(is_leap(2024))
