"""Stage 3: whatever executes a cell (Docker, local virtualenvs) behind one interface."""
