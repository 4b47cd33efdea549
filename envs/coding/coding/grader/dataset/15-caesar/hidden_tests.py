import unittest

from cipher import shift


class HiddenShiftTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(shift("abc", 1), "bcd")

    def test_wrap(self):
        self.assertEqual(shift("xyz", 3), "abc")

    def test_capitals(self):
        self.assertEqual(shift("Zebra", 1), "Afcsb")

    def test_other_characters(self):
        self.assertEqual(shift("a-b c!", 1), "b-c d!")

    def test_round_trip(self):
        self.assertEqual(shift(shift("Hello, World", 5), -5), "Hello, World")
