"""The guards at rollout's edges, where the policy, a web page or another process could reach in: what every
HTTP server refuses before its routes act (`http_guard`), secrets kept in files (`keyfiles`) and kept out of
text (`redaction`), how agents' commands are confined (`isolation`), a command run with a time limit and an
output budget (`bounded_process`), and TLS to a Temporal cluster (`temporal_tls`).

Importing the package imports none of its modules. docs/sandboxes.md says what the jail holds against.
"""
