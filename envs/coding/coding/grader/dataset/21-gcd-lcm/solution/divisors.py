def gcd(a, b):
    """The greatest common divisor of the positive integers `a` and `b`."""
    while b:
        a, b = b, a % b
    return a


def lcm(a, b):
    """The least common multiple of the positive integers `a` and `b`."""
    return a // gcd(a, b) * b
