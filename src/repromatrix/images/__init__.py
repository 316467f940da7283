"""What images are made of: Dockerfile renders, host wheelhouses, the base root file system."""
