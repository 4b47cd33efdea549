"""What only the grader may see: the hidden tests and reference solutions (`dataset/`), and the grading itself
(`harness`, trusted; `graded_server`, the jailed stand-in for the agent's code)."""
