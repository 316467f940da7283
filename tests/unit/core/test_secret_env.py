"""The secrets of the services watch answers through: redacted wherever output is written,
like HF_TOKEN, and never handed to a cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from repromatrix.results.store import atomic_write
from repromatrix.secret_env import SECRET_ENV, SERVICE_SECRET_ENV, redact_text, secrets_from

SERVICE = {
    "REPROMATRIX_WEBHOOK_SECRET": "whsec-loopback-1234",
    "GITHUB_TOKEN": "ghs_loopbacktoken5678",
    "GH_TOKEN": "gho_loopbacktoken9012",
    "BUILDKITE_API_TOKEN": "bkua_loopbacktoken3456",
}


@pytest.fixture
def service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SERVICE.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("service_env")
def test_every_service_secret_is_redacted_from_text_and_files(tmp_path: Path) -> None:
    text = " ".join(f"{name}={value}" for name, value in SERVICE.items())
    assert not any(value in redact_text(text) for value in SERVICE.values())
    atomic_write(tmp_path / "page.html", text.encode())
    written = (tmp_path / "page.html").read_text()
    assert not any(value in written for value in SERVICE.values())
    assert written.count("<redacted>") == len(SERVICE)


def test_service_secrets_are_not_handed_to_cells() -> None:
    assert set(SERVICE_SECRET_ENV) == set(SERVICE)
    assert not set(SERVICE_SECRET_ENV) & set(SECRET_ENV)
    assert secrets_from({**SERVICE, "HF_TOKEN": "hf_x"}) == {"HF_TOKEN": "hf_x"}
