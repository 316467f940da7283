"""One module per subcommand, each with ``add_parser(subparsers)`` and ``run(args) -> int``.

``cli`` imports them by name from ``COMMANDS``; a command module owns its
arguments and calls into the stage modules, and holds no logic of its own
beyond turning arguments into calls and results into output.
"""

COMMANDS = (
    "plan",
    "render",
    "prepare",
    "run",
    "rehearse",
    "bisect",
    "triage",
    "scenario",
    "report",
    "merge",
    "diff",
    "publish",
    "schema",
    "watch",
)
