import unittest

from temperature import convert


class ConvertTest(unittest.TestCase):
    def test_boiling(self):
        self.assertAlmostEqual(convert(100, "C", "F"), 212)
