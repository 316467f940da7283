"""``repromatrix watch``: new vLLM tags grade themselves. The tags (and moved digests) the
matrix gives that the published history has not graded, their cells run here (probes first)
or handed to the fleet, each answered against the baseline, published and sent."""
