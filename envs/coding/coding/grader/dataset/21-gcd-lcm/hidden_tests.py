import unittest

from divisors import gcd, lcm


class HiddenDivisorsTest(unittest.TestCase):
    def test_gcd(self):
        self.assertEqual(gcd(12, 18), 6)

    def test_gcd_coprime(self):
        self.assertEqual(gcd(7, 9), 1)

    def test_lcm_coprime(self):
        self.assertEqual(lcm(3, 5), 15)

    def test_lcm_shared_factor(self):
        self.assertEqual(lcm(4, 6), 12)

    def test_lcm_multiple(self):
        self.assertEqual(lcm(5, 10), 10)
