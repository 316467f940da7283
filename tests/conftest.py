"""Shared test configuration: what CI demands of the whole run."""

from __future__ import annotations

import os

import pytest

# Set by .ci/run: CI prepares everything the tests need (Docker, the images, the
# virtualenvs, Chromium, the registry), so a skipped test there is a path nobody checks.
NO_SKIPS = "REPROMATRIX_NO_SKIPS"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``REPROMATRIX_NO_SKIPS=1``, any skipped test fails the run."""
    if not os.environ.get(NO_SKIPS):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(
                f"{NO_SKIPS}: {skipped} test(s) skipped; CI must prepare what they need",
                red=True,
            )
