"""nox sessions: thin wrappers over the ``repromatrix`` command line.

``nox -s matrix`` is the main job; ``nox -s tests`` runs the test suite.
Arguments after ``--`` go to the command, e.g. ``nox -s plan -- --lane gpu``.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"


def _install(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


UNIT = "tests/unit"
INTEGRATION = "tests/integration"
# pytest-xdist: one worker per core, each taking more tests when it runs out.
SPREAD = ("-n", "auto", "--dist", "worksteal")


def pytest_runs(posargs: list[str]) -> list[list[str]]:
    """The pytest command lines of ``nox -s tests -- POSARGS``: the fast tests (tests/unit)
    spread over every core, then the real ones (tests/integration: Docker, vLLM, Slurm, a
    browser) one at a time, as they share the engine, the cluster and the machine's memory.
    Arguments that start with a path under tests/unit run spread too, unless they choose
    the workers themselves; any others run as given, in one process."""
    if not posargs:
        return [["pytest", *SPREAD, UNIT], ["pytest", INTEGRATION]]
    first = Path(posargs[0].split("::")[0])
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) for a in posargs)
    if first.parts[:2] == Path(UNIT).parts and not chosen and "no:xdist" not in posargs:
        return [["pytest", *SPREAD, *posargs]]
    return [["pytest", *posargs]]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (real Docker and real vLLM where the host has them): the fast
    tests on every core, then the real ones one at a time (``pytest_runs``)."""
    _install(session, "test")
    for command in pytest_runs(session.posargs):
        # pytest exits 5 when a selection collects nothing; that is not a failure of the suite.
        session.run(*command, success_codes=[0, 5])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict."""
    _install(session, "lint")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "noxfile.py")
    session.run("mypy")


@nox.session
def plan(session: nox.Session) -> None:
    """Print the default plan: every cell of matrix.yaml with its expected outcome."""
    _install(session)
    session.run("repromatrix", "plan", *session.posargs)


@nox.session
def render(session: nox.Session) -> None:
    """Render every image of the plan into dockerfiles/."""
    _install(session)
    session.run("repromatrix", "render", *session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """The main job: build or pull the images, run every cell this host can run, write results/."""
    _install(session)
    # Each run is packed by the durations the previous one measured, when there is one.
    given = any(arg.startswith("--durations-from") for arg in session.posargs)
    measured = [] if given else ["--durations-from", "latest"]
    session.run("repromatrix", "run", *measured, *session.posargs)


@nox.session
def zoo(session: nox.Session) -> None:
    """The zoo of real start-up crashes (scenarios/zoo) on the CPU lane, each hit and avoided:
    ``repromatrix run --lane cpu --scenarios scenarios/zoo``; more after ``--`` (``--only``)."""
    _install(session)
    session.run(
        "repromatrix", "run", "--lane", "cpu", "--scenarios", "scenarios/zoo", *session.posargs
    )


@nox.session
def rehearse(session: nox.Session) -> None:
    """The GPU lane for real against a local registry, vLLM on the CPU (needs Docker and
    Debian's docker-registry): a check of the plumbing, not of GPU kernels."""
    _install(session)
    session.run("repromatrix", "rehearse", *session.posargs)


@nox.session
def triage(session: nox.Session) -> None:
    """Name the root cause in a vLLM log: ``nox -s triage -- FILE``."""
    _install(session)
    session.run("repromatrix", "triage", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Rebuild junit.xml and the compatibility table from saved results: ``-- RESULTS_DIR``."""
    _install(session)
    session.run("repromatrix", "report", *session.posargs)


@nox.session
def merge(session: nox.Session) -> None:
    """Combine result shards from many runners: ``-- DIR... --out DIR``."""
    _install(session)
    session.run("repromatrix", "merge", *session.posargs)


@nox.session
def diff(session: nox.Session) -> None:
    """The upgrade question: ``-- RESULTS --baseline TAG --candidate TAG``."""
    _install(session)
    session.run("repromatrix", "diff", *session.posargs)
