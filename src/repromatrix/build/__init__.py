"""Stage 2: what images are made of: Dockerfile renders, wheelhouses, base rootfs, tiny models."""
