import re

PATTERN = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text):
    """The number of seconds in a duration such as "1h30m", "45s" or "2h5m10s"."""
    found = PATTERN.match(text)
    if not found or not text:
        raise ValueError(f"not a duration: {text!r}")
    hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return hours * 3600 + minutes * 60 + seconds
