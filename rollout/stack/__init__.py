"""The embedded stack: Postgres, the Temporal dev server and the blob directory under one data directory."""
