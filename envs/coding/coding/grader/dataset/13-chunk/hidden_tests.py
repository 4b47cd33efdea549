import unittest

from batching import chunks


class HiddenChunksTest(unittest.TestCase):
    def test_exact(self):
        self.assertEqual(chunks([1, 2, 3, 4], 2), [[1, 2], [3, 4]])

    def test_leftover(self):
        self.assertEqual(chunks([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])

    def test_bigger_than_the_list(self):
        self.assertEqual(chunks([1, 2], 5), [[1, 2]])

    def test_empty(self):
        self.assertEqual(chunks([], 3), [])

    def test_bad_size(self):
        with self.assertRaises(ValueError):
            chunks([1], 0)
