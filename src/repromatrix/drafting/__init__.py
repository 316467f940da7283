"""``repromatrix scenario draft``: a scenario file drafted from a crash log, checked on logs
(``check``) and tried on this host's lanes (``trial``).

``signature`` generalises a root cause into a safe pattern; ``write`` turns a log's
diagnosis and launch record into scenario YAML (pure text, comments where the log is
silent); ``check`` triages logs with the draft; ``trial`` plans it against the matrix and
runs its cells through ``run.main.execute_run``.
"""
