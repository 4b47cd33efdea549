import unittest

from stack_box import Stack


class HiddenStackTest(unittest.TestCase):
    def test_push_pop_order(self):
        stack = Stack()
        stack.push(1)
        stack.push(2)
        self.assertEqual([stack.pop(), stack.pop()], [2, 1])

    def test_peek_leaves_the_item(self):
        stack = Stack()
        stack.push("a")
        self.assertEqual(stack.peek(), "a")
        self.assertEqual(len(stack), 1)

    def test_is_empty(self):
        stack = Stack()
        self.assertTrue(stack.is_empty())
        stack.push(0)
        self.assertFalse(stack.is_empty())

    def test_pop_empty(self):
        with self.assertRaisesRegex(IndexError, "empty stack"):
            Stack().pop()

    def test_peek_empty(self):
        with self.assertRaisesRegex(IndexError, "empty stack"):
            Stack().peek()
