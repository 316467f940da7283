"""Stage 4: the run itself: stages, host facts, preparation, one cell, outcomes, progress."""
