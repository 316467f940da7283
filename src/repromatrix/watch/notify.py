"""Where an answer goes besides the job summary: a webhook, and a GitHub issue or comment.

Webhook: the answer's JSON payload (``watch.answer``) POSTed to a URL, signed
as GitHub signs its own webhooks: ``X-Repromatrix-Signature-256: sha256=<hex>``,
the HMAC-SHA256 of the exact body with the shared secret
(``REPROMATRIX_WEBHOOK_SECRET``); ``X-Repromatrix-Event`` names the event
(``answer``) and ``X-Repromatrix-Delivery`` the answer (stable across retries,
so a receiver can drop a repeat). Attempts are bounded (``http_calls.deliver``).

GitHub: with a token, the answer as Markdown in an issue opened per tag (a
later answer for the same tag, the final after a preliminary one or a moved
digest, is a comment on it), or as a comment on one issue given
(``--github-issue``). The API URL is configurable for GitHub Enterprise.

A channel that fails never fails the grading: its failure is reported and the
answer is kept to be sent again in the next round.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repromatrix.fleet.dispatch import GITHUB_API, github_headers
from repromatrix.http_calls import (
    DEFAULT_ATTEMPTS,
    DEFAULT_TIMEOUT_S,
    Call,
    Delivery,
    deliver,
    json_call,
)
from repromatrix.secret_env import redact_text

SIGNATURE_HEADER = "X-Repromatrix-Signature-256"
EVENT_HEADER = "X-Repromatrix-Event"
DELIVERY_HEADER = "X-Repromatrix-Delivery"
EVENT = "answer"
USER_AGENT = "repromatrix-watch"
ISSUE_LABELS = ("repromatrix",)


def signature(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``body`` with ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload_bytes(payload: Mapping[str, Any]) -> bytes:
    """The body sent: the payload as JSON, every secret of this process redacted."""
    return redact_text(json.dumps(payload, sort_keys=True, ensure_ascii=False)).encode()


@dataclass(frozen=True)
class Webhook:
    """A URL that takes the answer's JSON payload, signed with a shared secret."""

    url: str
    secret: str
    attempts: int = DEFAULT_ATTEMPTS
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str = "webhook"

    def call(self, payload: Mapping[str, Any], delivery_id: str) -> Call:
        """The signed POST of one payload."""
        body = payload_bytes(payload)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            EVENT_HEADER: EVENT,
            DELIVERY_HEADER: delivery_id,
            SIGNATURE_HEADER: signature(self.secret, body),
        }
        return Call("POST", self.url, headers, body)

    def send(self, payload: Mapping[str, Any], delivery_id: str) -> Delivery:
        """POST it, at most ``attempts`` times."""
        return deliver(self.call(payload, delivery_id), self.attempts, self.timeout_s)


@dataclass(frozen=True)
class GitHubIssues:
    """Answers as issues (one per tag) or comments on one issue, through the REST API."""

    repo: str  # owner/name
    token: str
    api: str = GITHUB_API
    issue: int | None = None  # comment on this issue instead of opening one per tag
    attempts: int = DEFAULT_ATTEMPTS
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str = "github"

    def call(self, title: str, markdown: str, issue: int | None) -> Call:
        """A comment on ``issue`` (or the one given), else a new issue titled ``title``."""
        base = f"{self.api.rstrip('/')}/repos/{self.repo}/issues"
        body = redact_text(markdown)
        target = self.issue or issue
        secret = frozenset({"Authorization"})
        if target is not None:
            document: dict[str, Any] = {"body": body}
            return json_call(
                "POST", f"{base}/{target}/comments", document, github_headers(self.token), secret
            )
        document = {"title": redact_text(title), "body": body, "labels": list(ISSUE_LABELS)}
        return json_call("POST", base, document, github_headers(self.token), secret)

    def send(self, title: str, markdown: str, issue: int | None) -> tuple[Delivery, int | None]:
        """Post it; the delivery and the issue it went to (a new issue's number)."""
        delivery = deliver(self.call(title, markdown, issue), self.attempts, self.timeout_s)
        target = self.issue or issue
        if delivery.ok and target is None:
            answer = delivery.last.json()
            number = answer.get("number") if isinstance(answer, dict) else None
            target = number if isinstance(number, int) else None
        return delivery, target


@dataclass(frozen=True)
class Channels:
    """Where answers go besides standard output."""

    webhook: Webhook | None = None
    github: GitHubIssues | None = None
    summary: Path | None = None  # Markdown appended here (a job summary)
