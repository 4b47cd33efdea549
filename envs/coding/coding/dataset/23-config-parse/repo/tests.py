import unittest

from settings import parse_config


class ParseTest(unittest.TestCase):
    def test_comment(self):
        self.assertEqual(parse_config("# hi\na = 1"), {"a": "1"})
