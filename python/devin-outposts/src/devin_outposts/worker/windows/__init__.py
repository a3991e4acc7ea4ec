"""The Windows service host: one worker instance as a native Windows service (docs/windows-worker.md)."""
