import unittest

from rle import encode


class HiddenEncodeTest(unittest.TestCase):
    def test_empty(self):
        self.assertEqual(encode(""), "")

    def test_single(self):
        self.assertEqual(encode("a"), "1a")

    def test_runs(self):
        self.assertEqual(encode("aaabcc"), "3a1b2c")

    def test_no_repeats(self):
        self.assertEqual(encode("abc"), "1a1b1c")
