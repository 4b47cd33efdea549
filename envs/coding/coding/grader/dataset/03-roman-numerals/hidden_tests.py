import unittest

from numerals import to_roman


class HiddenRomanTest(unittest.TestCase):
    def test_additive(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(2023 - 5), "MMXVIII")

    def test_four_and_nine(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")

    def test_tens(self):
        self.assertEqual(to_roman(40), "XL")
        self.assertEqual(to_roman(90), "XC")

    def test_hundreds(self):
        self.assertEqual(to_roman(400), "CD")
        self.assertEqual(to_roman(900), "CM")

    def test_mixed(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            to_roman(0)
