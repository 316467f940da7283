"""The published site: every run's upgrade view, per-scenario and per-cell pages, and history."""
