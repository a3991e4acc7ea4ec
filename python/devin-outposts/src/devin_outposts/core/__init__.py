"""The claim-and-serve machinery the worker and the orchestrator share (module map: see below)."""
