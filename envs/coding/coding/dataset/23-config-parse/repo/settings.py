def parse_config(text):
    """The `key = value` lines of `text` as a dict; blank lines and `#` comments are skipped."""
    settings = {}
    for line in text.splitlines():
        key, value = line.split("=")
        settings[key.strip()] = value.strip()
    return settings
