import unittest

from phrases import is_palindrome


class HiddenPalindromeTest(unittest.TestCase):
    def test_word(self):
        self.assertTrue(is_palindrome("racecar"))

    def test_mixed_case(self):
        self.assertTrue(is_palindrome("Racecar"))

    def test_not_a_palindrome(self):
        self.assertFalse(is_palindrome("hello"))

    def test_spaces(self):
        self.assertTrue(is_palindrome("Never odd or even"))

    def test_punctuation(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama!"))
