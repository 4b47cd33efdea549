import unittest

from batching import chunks


class ChunksTest(unittest.TestCase):
    def test_leftover(self):
        self.assertEqual(chunks([1, 2, 3], 2), [[1, 2], [3]])
