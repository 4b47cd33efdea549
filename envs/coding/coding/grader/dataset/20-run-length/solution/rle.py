def encode(text):
    """`text` run-length encoded: each run of one character as its length and the character."""
    out = []
    run_character, run_length = "", 0
    for character in text:
        if character == run_character:
            run_length += 1
            continue
        if run_length:
            out.append(f"{run_length}{run_character}")
        run_character, run_length = character, 1
    if run_length:
        out.append(f"{run_length}{run_character}")
    return "".join(out)
