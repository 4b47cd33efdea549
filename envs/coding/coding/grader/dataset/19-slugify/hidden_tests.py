import unittest

from slugs import slugify


class HiddenSlugTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_single_word(self):
        self.assertEqual(slugify("Rollout"), "rollout")

    def test_punctuation(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_runs_of_spaces_and_dashes(self):
        self.assertEqual(slugify("a  b -- c"), "a-b-c")

    def test_edges(self):
        self.assertEqual(slugify("  --Edge case--  "), "edge-case")
