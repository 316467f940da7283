"""repromatrix: which documented vLLM start-up crashes does each image hit or avoid."""

__version__ = "0.1.0"
