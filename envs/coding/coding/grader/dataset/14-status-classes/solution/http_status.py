def status_class(code):
    """The class of the HTTP status `code`: informational, success, redirect, client error or server error."""
    if 100 <= code < 200:
        return "informational"
    if 200 <= code < 300:
        return "success"
    if 300 <= code < 400:
        return "redirect"
    if 400 <= code < 500:
        return "client error"
    if 500 <= code < 600:
        return "server error"
    raise ValueError(f"not an HTTP status code: {code}")
