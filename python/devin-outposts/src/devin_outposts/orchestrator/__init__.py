"""The orchestrator: claim first, then a fresh machine per session (docs/orchestrator.md)."""
