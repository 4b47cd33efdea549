def shift(text, key):
    """`text` with every letter moved `key` places along the alphabet (wrapping), case kept."""
    out = []
    for character in text:
        if "a" <= character <= "z":
            out.append(chr((ord(character) - ord("a") + key) % 26 + ord("a")))
        elif "A" <= character <= "Z":
            out.append(chr((ord(character) - ord("A") + key) % 26 + ord("A")))
        else:
            out.append(character)
    return "".join(out)
