import unittest

from rle import encode


class EncodeTest(unittest.TestCase):
    def test_runs(self):
        self.assertEqual(encode("aaabcc"), "3a1b2c")
