import unittest

from words import word_counts


class WordCountTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(word_counts("a b a"), {"a": 2, "b": 1})
