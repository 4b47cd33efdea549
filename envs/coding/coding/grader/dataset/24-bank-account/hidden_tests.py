import unittest

from bank import Account, InsufficientFunds


class HiddenAccountTest(unittest.TestCase):
    def test_deposit(self):
        account = Account()
        account.deposit(10)
        self.assertEqual(account.balance, 10)

    def test_withdraw(self):
        account = Account(10)
        account.withdraw(4)
        self.assertEqual(account.balance, 6)

    def test_overdraw(self):
        account = Account(5)
        with self.assertRaises(InsufficientFunds):
            account.withdraw(10)
        self.assertEqual(account.balance, 5)

    def test_negative_deposit(self):
        with self.assertRaises(ValueError):
            Account().deposit(-1)

    def test_zero_withdrawal(self):
        with self.assertRaises(ValueError):
            Account(5).withdraw(0)
