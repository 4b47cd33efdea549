def is_palindrome(text):
    """Whether `text` reads the same backwards, counting only letters and digits, ignoring case."""
    lowered = text.lower()
    return lowered == lowered[::-1]
