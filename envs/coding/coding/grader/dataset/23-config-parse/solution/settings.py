def parse_config(text):
    """The `key = value` lines of `text` as a dict; blank lines and `#` comments are skipped."""
    settings = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, value = stripped.split("=", 1)
        settings[key.strip()] = value.strip()
    return settings
