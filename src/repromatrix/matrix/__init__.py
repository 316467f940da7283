"""Stage 1: matrix.yaml and the scenario files become cells (pure)."""
