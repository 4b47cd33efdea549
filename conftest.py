"""Root pytest configuration: shared fixtures, and every Python example in README.md and docs/ run as a test.

A Markdown code block tagged `python` is executed in order with the blocks before it in the same file;
`ledger_url`, `stack_settings` (a real, session-wide embedded stack), `models_dir` (the built-in models'
cache), `minecraft_home` (the minecraft kind's packages, installed once), `trained_run` (a finished two-step
run on that stack, tracked to W&B offline and MLflow's local store), `trained_run_tracking` (where those
went) and `otlp_receiver` (where its traces went) are in its namespace.
"""

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

pytest_plugins = ["tests.fixtures", "tests.scheduling"]

pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser()],
    patterns=["README.md", "docs/*.md"],
    fixtures=[
        "ledger_url",
        "stack_settings",
        "models_dir",
        "minecraft_home",
        "trained_run",
        "trained_run_tracking",
        "otlp_receiver",
    ],
).pytest()
