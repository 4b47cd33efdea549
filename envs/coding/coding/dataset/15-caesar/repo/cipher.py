def shift(text, key):
    """`text` with every letter moved `key` places along the alphabet (wrapping), case kept."""
    out = []
    for character in text:
        if character.isalpha():
            out.append(chr(ord(character) + key))
        else:
            out.append(character)
    return "".join(out)
