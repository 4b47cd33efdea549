"""The embedded stack: Postgres, the Temporal dev server, the blob directory, the engine, gateway, workers and
dashboard, under one data directory and one supervisor that restarts what dies (`rollout up`)."""
