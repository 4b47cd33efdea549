import re


def slugify(title):
    """`title` as a URL slug: lower case, words joined by single dashes, letters and digits only."""
    words = re.sub(r"[^a-z0-9\s-]", "", title.lower())
    return re.sub(r"[\s-]+", "-", words).strip("-")
