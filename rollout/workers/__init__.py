"""The worker processes: a runner (episodes, evals, preflights on the runner queue) and a trainer (training
steps and bridges on the trainer queue), each a Temporal worker with its workflows and activities."""
