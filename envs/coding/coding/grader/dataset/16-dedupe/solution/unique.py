def dedupe(items):
    """`items` without repeats, each kept where it first occurs."""
    seen = set()
    kept = []
    for item in items:
        if item not in seen:
            seen.add(item)
            kept.append(item)
    return kept
