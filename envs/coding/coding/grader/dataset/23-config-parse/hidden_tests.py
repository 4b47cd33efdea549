import unittest

from settings import parse_config


class HiddenParseTest(unittest.TestCase):
    def test_pairs(self):
        self.assertEqual(parse_config("a = 1\nb=two"), {"a": "1", "b": "two"})

    def test_blank_lines(self):
        self.assertEqual(parse_config("a = 1\n\n  \nb = 2"), {"a": "1", "b": "2"})

    def test_comments(self):
        self.assertEqual(parse_config("# settings\na = 1\n  # indented comment"), {"a": "1"})

    def test_equals_in_value(self):
        self.assertEqual(parse_config("query = x=1&y=2"), {"query": "x=1&y=2"})
