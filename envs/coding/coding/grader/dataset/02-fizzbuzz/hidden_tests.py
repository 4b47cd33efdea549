import unittest

from game import fizzbuzz


class HiddenFizzBuzzTest(unittest.TestCase):
    def test_plain_number(self):
        self.assertEqual(fizzbuzz(7), "7")

    def test_fizz(self):
        self.assertEqual(fizzbuzz(9), "Fizz")

    def test_buzz(self):
        self.assertEqual(fizzbuzz(10), "Buzz")

    def test_fizzbuzz(self):
        self.assertEqual(fizzbuzz(15), "FizzBuzz")

    def test_fizzbuzz_larger(self):
        self.assertEqual(fizzbuzz(90), "FizzBuzz")
