"""Programs copied into every image: the cell harness and the tiny model generator.

They run on the image's own python3 (3.8 or later) with only the standard
library (the generator also needs the image's torch and transformers), so
nothing here may import ``repromatrix``. The host imports them only to share
their constants and command builders with ``harness_spec``.
"""
