"""The coding environment: small Python repository tasks in a `shell` sandbox, graded by hidden tests.

`coding.environment` (the environments), `coding.tasks` (the shipped dataset, what the agent may see),
`coding.grading` (moving a repository through the sandbox, and grading a copy of it), `coding.grader` (what
only the grader may see: the hidden tests, the reference solutions, and the grader's jail), `coding.solver`
(the scripted solver), `coding.agents` (the wrapper command agents run through).
"""
