"""This runner's GPUs: what nvidia-smi says (``nvidia_smi``), what the run may use
(``runner``), whether a GPU is the one a matrix entry names (``identity``) and whether
it is idle now (``idle``). The one package that looks at the host's GPUs."""
