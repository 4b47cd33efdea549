import unittest

from ordinals import ordinal


class OrdinalTest(unittest.TestCase):
    def test_eleven(self):
        self.assertEqual(ordinal(11), "11th")
