"""``repromatrix run --executor slurm``: the run's cells as Slurm job arrays on a cluster.

``main`` is the run on the submitting host, top to bottom; ``arrays`` splits the cells
into arrays and tasks, ``script`` writes their batch scripts, ``cluster`` is the one
module that runs Slurm's commands (``scontrol`` read by ``scontrol``), ``submission``
keeps what was submitted in the run folder, ``task`` is what each task runs on its node,
and ``finish`` turns the tasks' ends and shards into the run's results and reports.
"""
