"""The coding environment: small Python repository tasks in a `shell` sandbox, graded by hidden tests.

`coding.environment` (the environments), `coding.tasks` (the shipped dataset), `coding.grading` (moving a
repository through the sandbox and grading it there), `coding.hidden_runner` (the script that runs hidden tests
in the sandbox), `coding.solver` (the scripted solver), `coding.agents` (the wrapper command agents run through).
"""
