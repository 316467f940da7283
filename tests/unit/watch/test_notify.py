"""Where an answer goes: a signed webhook and GitHub issues, sent for real to servers on the
loopback; an answer a channel did not take is sent again next round, within bounds."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

from repromatrix.watch import deliver
from repromatrix.watch.notify import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Channels,
    GitHubIssues,
    Webhook,
)
from repromatrix.watch.state import WatchFolder, read_json, write_json
from support.webhook import free_port, receiver

SECRET = "shared-secret-of-the-team"
PAYLOAD: dict[str, Any] = {"schema_version": 1, "tag": "v0.33.0", "answer": "safe"}


def keep(folder: WatchFolder, key: str = "gpu-v0.33.0-abc", stage: str = "final") -> Path:
    path = folder.answer(key, stage)
    write_json(path, {"key": key, "lane": "gpu", "tag": "v0.33.0", "stage": stage,
                      "title": "vLLM v0.33.0 (gpu lane): safe", "payload": PAYLOAD,
                      "markdown": "### vLLM v0.33.0 (gpu lane): safe\n", "delivered": {},
                      "attempts": {}})  # fmt: skip
    return path


def test_the_webhook_gets_the_payload_signed_with_the_shared_secret() -> None:
    with receiver() as hook:
        delivery = Webhook(hook.url, SECRET).send(PAYLOAD, "gpu-v0.33.0-abc.final")
    assert delivery.ok
    [got] = hook.got
    expected = "sha256=" + hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
    assert got.headers[SIGNATURE_HEADER] == expected
    assert (got.headers[EVENT_HEADER], got.headers[DELIVERY_HEADER]) == (
        "answer", "gpu-v0.33.0-abc.final",
    )  # fmt: skip
    assert got.json() == PAYLOAD


def test_a_secret_in_an_answer_never_leaves(monkeypatch: Any) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_leakedintoacause")
    call = Webhook("http://127.0.0.1:1/", SECRET).call({"cause": "token ghs_leakedintoacause"}, "k")
    assert b"ghs_leakedintoacause" not in call.body and b"<redacted>" in call.body


def test_an_issue_is_opened_per_tag_then_commented_on(tmp_path: Path) -> None:
    folder = WatchFolder(tmp_path / "watch")
    keep(folder, stage="preliminary")
    keep(folder, stage="final")
    with receiver(status=201, answer={"number": 17}) as api:
        github = GitHubIssues("team/compat", "ghp_loopback", api=f"{api.url}/api/v3")
        lines, owed = deliver.deliver_all(folder, Channels(github=github), lambda _l: None)
    assert owed == 0 and len(lines) == 2
    opened, commented = api.got
    assert opened.path == "/api/v3/repos/team/compat/issues"
    assert opened.json()["title"] == "vLLM v0.33.0 (gpu lane): safe"
    assert opened.json()["labels"] == ["repromatrix"]
    assert commented.path == "/api/v3/repos/team/compat/issues/17/comments"
    assert read_json(folder.issues) == {"gpu/v0.33.0": 17}


def test_a_refused_answer_is_kept_sent_next_round_and_never_twice(tmp_path: Path) -> None:
    folder = WatchFolder(tmp_path / "watch")
    path = keep(folder)
    refusing = Webhook(f"http://127.0.0.1:{free_port()}/", SECRET, attempts=1)
    lines, owed = deliver.deliver_all(folder, Channels(webhook=refusing), lambda _l: None)
    assert owed == 1 and lines[0].startswith("warning: answer not sent: vLLM v0.33.0")
    assert "tried again next round" in lines[0]
    with receiver() as hook:
        for _ in range(2):
            deliver.deliver_all(folder, Channels(webhook=Webhook(hook.url, SECRET)), print)
    assert len(hook.got) == 1
    assert json.loads(path.read_text())["delivered"] == {"webhook": "delivered (HTTP 200)"}


def test_a_webhook_that_hangs_is_given_up_on_after_the_rounds_allowed(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(deliver, "MAX_ROUNDS", 2)
    folder = WatchFolder(tmp_path / "watch")
    keep(folder)
    with receiver(hang=True) as hook:
        hanging = Webhook(hook.url, SECRET, attempts=1, timeout_s=0.3)
        said = [deliver.deliver_all(folder, Channels(webhook=hanging), lambda _l: None)
                for _ in range(3)]  # fmt: skip
    assert [owed for _, owed in said] == [1, 0, 0]
    assert "timed out" in said[0][0][0] and said[1][0][0].endswith("; given up")
    assert said[2][0] == ()  # given up: not tried a third time
    assert len(hook.got) == 2


def test_an_answer_kept_in_schema_version_1_is_still_delivered_as_it_was_made(
    tmp_path: Path,
) -> None:
    # Kept by a round before the safety words of version 2 (``unsafe``, a ``change`` word),
    # owed to the webhook: delivered as it was made, never re-read into today's words.
    folder = WatchFolder(tmp_path / "watch")
    path = keep(folder)
    old = {"schema_version": 1, "tag": "v0.33.0", "answer": "unsafe",
           "changes": {"counts": {"newly_hit": 1}, "items": [{"change": "newly_hit"}]}}  # fmt: skip
    write_json(path, {**json.loads(path.read_text()), "payload": old})
    with receiver() as hook:
        lines, owed = deliver.deliver_all(
            folder, Channels(webhook=Webhook(hook.url, SECRET)), print
        )
    assert owed == 0 and lines[0].startswith("answer sent")
    [got] = hook.got
    assert got.json() == old
