def is_palindrome(text):
    """Whether `text` reads the same backwards, counting only letters and digits, ignoring case."""
    kept = [character.lower() for character in text if character.isalnum()]
    return kept == kept[::-1]
