def word_counts(text):
    """How often each word occurs in `text`: {word in lower case: count}."""
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
