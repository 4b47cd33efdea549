import unittest

from calendar_rules import is_leap


class HiddenLeapTest(unittest.TestCase):
    def test_divisible_by_four(self):
        self.assertTrue(is_leap(2024))

    def test_not_divisible_by_four(self):
        self.assertFalse(is_leap(2023))

    def test_century(self):
        self.assertFalse(is_leap(1900))

    def test_four_hundred(self):
        self.assertTrue(is_leap(2000))

    def test_another_four_hundred(self):
        self.assertTrue(is_leap(2400))
