def flatten(items):
    """The elements of the nested lists `items`, in order, as one flat list."""
    flat = []
    for item in items:
        if isinstance(item, list):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat
