import unittest

from game import fizzbuzz


class FizzBuzzTest(unittest.TestCase):
    def test_fifteen(self):
        self.assertEqual(fizzbuzz(15), "FizzBuzz")
