"""The models cells serve: the tiny local model and its adapters; the Hugging Face downloader."""
