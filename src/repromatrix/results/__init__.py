"""Stage 5: the run folder on disk (one reader, one writer), verdicts and merge."""
