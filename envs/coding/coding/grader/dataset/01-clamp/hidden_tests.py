import unittest

from bounds import clamp


class HiddenClampTest(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_below(self):
        self.assertEqual(clamp(-3, 0, 10), 0)

    def test_above(self):
        self.assertEqual(clamp(15, 0, 10), 10)

    def test_on_the_bounds(self):
        self.assertEqual(clamp(0, 0, 10), 0)
        self.assertEqual(clamp(10, 0, 10), 10)

    def test_floats_above(self):
        self.assertEqual(clamp(2.5, -1.0, 1.5), 1.5)
