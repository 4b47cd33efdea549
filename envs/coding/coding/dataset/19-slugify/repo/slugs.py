def slugify(title):
    """`title` as a URL slug: lower case, words joined by single dashes, letters and digits only."""
    return title.lower().replace(" ", "-")
