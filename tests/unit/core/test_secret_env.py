"""The secrets of the services watch answers through: redacted wherever output is written,
like HF_TOKEN, and never handed to a cell; tokens of a well-known shape redacted whatever the
environment holds; a value matched whole, and one too short to match safely refused."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from repromatrix import secret_env
from repromatrix.results.store import atomic_write
from repromatrix.secret_env import (
    REDACTED,
    SECRET_ENV,
    SERVICE_SECRET_ENV,
    StreamRedactor,
    redact_text,
    secrets_from,
)

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


# A line of each well-known shape (no token is real) and the part that must not survive.
SHAPED = [
    ("token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567 used", "hf_AbCdEf"),
    ("GITHUB ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ.", "ghp_abc"),
    ("oauth gho_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "gho_abc"),
    ("server ghs_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "ghs_abc"),
    ("pat github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789AB", "github_pat_11"),
    ("keys AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AKIAIOSF"),
    ("keys AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtn"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtn"),
    ('{"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIi.c2ln"}', "eyJhbG"),
    ("authorization: token 0123456789abcdef0123", "0123456789abcdef"),
    ("cloning https://bot:hunter2pass@example.com/r.git", "hunter2pass"),
    ("pip from https://oauth2token123@gitlab.example.com/x", "oauth2token123"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx0123456789abcdef\n"
        "abcdefghijklmnopqrstuvwxyz0123456789+/\n-----END RSA PRIVATE KEY-----\nafter",
        "MIIEowIBAAK",
    ),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nINFO the log goes on", "MIIEvQ"),
    (
        r'"key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG\n-----END PRIVATE KEY-----"',
        "MIIE",
    ),
]
ORDINARY = [
    "INFO 11-29 18:28:50 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
    "RuntimeError: missing Bearer authentication for the hub",
    "weights at /root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B-Instruct",
    "sha 0123456789abcdef0123456789abcdef01234567 high throughput enough",
]


@pytest.mark.parametrize(("text", "secret"), SHAPED, ids=range(len(SHAPED)))
def test_every_token_shape_is_redacted_from_text_streams_and_files(
    text: str, secret: str, tmp_path: Path
) -> None:
    assert secret in text
    redacted = redact_text(text, {})
    assert secret not in redacted and REDACTED in redacted
    # Followed by more lines too: a line kept back whole keeps what makes its token one.
    for data in (text.encode(), f"{text}\nINFO next\n".encode()):
        check_every_split(data)
    atomic_write(tmp_path / "report.md", text.encode())
    assert secret not in (tmp_path / "report.md").read_text()


def check_every_split(data: bytes) -> None:
    """The stream redactor gives what ``redact`` gives the whole, wherever a chunk ends."""
    whole = secret_env.redact(data, {})
    for split in range(len(data) + 1):
        redactor = StreamRedactor({})
        out = redactor.feed(data[:split]) + redactor.feed(data[split:]) + redactor.flush()
        assert out == whole, split


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_log_lines_are_left_as_they_are(text: str) -> None:
    assert redact_text(text, {}) == text


def test_a_value_is_redacted_whole_never_inside_other_words() -> None:
    secrets = {"HF_TOKEN": "s3cretvalue"}
    assert redact_text("a s3cretvalue, b", secrets) == "a <redacted>, b"
    assert redact_text("xs3cretvalue s3cretvalue9", secrets) == "xs3cretvalue s3cretvalue9"


def test_a_short_value_is_not_redacted_and_said_so_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # HF_TOKEN=0 replaced inside every number: compat.json corrupted, and the value shown.
    monkeypatch.setattr(secret_env, "_warned", set())
    monkeypatch.setenv("HF_TOKEN", "0")
    document = json.dumps({"cells": 10, "ready_s": 20.05, "version": "0.30.0"})
    atomic_write(tmp_path / "compat.json", document.encode())
    assert (tmp_path / "compat.json").read_text() == document
    assert redact_text("took 100 s") == "took 100 s"
    err = capsys.readouterr().err
    assert err.count("warning: HF_TOKEN is shorter than") == 1
    assert secret_env.MIN_SECRET_LEN >= 8


def test_a_secrets_name_is_known_by_what_it_says() -> None:
    secret = ["HF_TOKEN", "GITHUB_TOKEN", "REPROMATRIX_WEBHOOK_SECRET", "AWS_SECRET_ACCESS_KEY",
              "AWS_ACCESS_KEY_ID", "DB_PASSWORD", "API_KEY", "GCP_CREDENTIALS"]  # fmt: skip
    plain = ["PATH", "HOME", "REPROMATRIX_CACHE", "HF_HOME", "KEYBOARD", "MONKEYS"]
    assert all(secret_env.is_secret_name(name) for name in secret)
    assert not any(secret_env.is_secret_name(name) for name in plain)


PIECES = [
    "Authorization: Bearer ", "eyJhbGciOiJIUzI1NiJ9.c2ln", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "4567", "AKIAIOSFODNN7EXAMPLE", " ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "https://bot:", "hunter2pass@example.com", "-----BEGIN PRIVATE KEY-----",
    "MIIEvQIBADANBgkqhkiG9w0B", "-----END PRIVATE KEY-----", "\n", "\r", "x", "s3cretvalue",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@example(  # a key's header, then a line, then its end in the next chunk
    ["-----BEGIN PRIVATE KEY-----", "Authorization: Bearer ", "\n", "-----END PRIVATE KEY-----"],
    [50],
)
@example(  # a second header not yet whole where the first one's end has not come
    ["-----BEGIN PRIVATE KEY-----", "x", "\n", "-----BEGIN PRIVATE KEY-----",
     "-----END PRIVATE KEY-----"],
    [40],
)  # fmt: skip
@given(
    st.lists(st.sampled_from(PIECES), max_size=24),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_the_stream_redactor_gives_what_redact_gives_the_whole_on_any_chunking(
    pieces: list[str], cuts: list[int]
) -> None:
    secrets = {"HF_TOKEN": "s3cretvalue"}
    text = "".join(pieces).encode()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    redactor = StreamRedactor(secrets)
    out = b"".join(redactor.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + redactor.flush() == secret_env.redact(text, secrets)
