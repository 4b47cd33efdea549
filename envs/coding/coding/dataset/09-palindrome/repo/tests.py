import unittest

from phrases import is_palindrome


class PalindromeTest(unittest.TestCase):
    def test_phrase(self):
        self.assertTrue(is_palindrome("Never odd or even"))
