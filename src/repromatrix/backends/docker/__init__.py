"""The Docker backend: its kind (what a run asks of it), its engine adapter, its calls as values."""
