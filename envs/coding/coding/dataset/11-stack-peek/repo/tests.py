import unittest

from stack_box import Stack


class StackTest(unittest.TestCase):
    def test_push_pop(self):
        stack = Stack()
        stack.push(1)
        self.assertEqual(stack.pop(), 1)
