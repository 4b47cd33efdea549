import unittest

from words import word_counts


class HiddenWordCountTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(word_counts("a b a"), {"a": 2, "b": 1})

    def test_case_insensitive(self):
        self.assertEqual(word_counts("The the THE"), {"the": 3})

    def test_runs_of_spaces(self):
        self.assertEqual(word_counts("go  go   stop"), {"go": 2, "stop": 1})

    def test_newlines_and_tabs(self):
        self.assertEqual(word_counts("one\ntwo\tone"), {"one": 2, "two": 1})

    def test_empty(self):
        self.assertEqual(word_counts(""), {})
