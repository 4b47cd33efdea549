import unittest

from bank import Account, InsufficientFunds


class AccountTest(unittest.TestCase):
    def test_overdraw(self):
        with self.assertRaises(InsufficientFunds):
            Account(5).withdraw(10)
