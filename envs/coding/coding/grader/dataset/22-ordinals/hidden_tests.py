import unittest

from ordinals import ordinal


class HiddenOrdinalTest(unittest.TestCase):
    def test_first_four(self):
        self.assertEqual([ordinal(n) for n in (1, 2, 3, 4)], ["1st", "2nd", "3rd", "4th"])

    def test_twenties(self):
        self.assertEqual([ordinal(n) for n in (21, 22, 23)], ["21st", "22nd", "23rd"])

    def test_teens(self):
        self.assertEqual([ordinal(n) for n in (11, 12, 13)], ["11th", "12th", "13th"])

    def test_hundreds_teens(self):
        self.assertEqual([ordinal(n) for n in (111, 212)], ["111th", "212th"])

    def test_hundred_and_one(self):
        self.assertEqual(ordinal(101), "101st")
