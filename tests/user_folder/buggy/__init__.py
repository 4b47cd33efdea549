"""An environment as a user might write one, with bugs (tests/test_environment_bugs.py)."""
