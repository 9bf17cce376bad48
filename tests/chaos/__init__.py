"""The chaos soak: ``python -m tests.chaos.run --minutes N [--seed S]`` (see docs/faults.md)."""
