class InsufficientFunds(Exception):
    """A withdrawal larger than the balance."""


class Account:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        self.balance += amount

    def withdraw(self, amount):
        self.balance -= amount
