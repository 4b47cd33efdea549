import unittest

from divisors import lcm


class LcmTest(unittest.TestCase):
    def test_shared_factor(self):
        self.assertEqual(lcm(4, 6), 12)
