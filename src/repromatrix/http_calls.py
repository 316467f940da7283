"""The HTTP calls repromatrix makes to services (a webhook, the GitHub and Buildkite APIs).

A call is a plain value (``Call``: method, URL, headers, body), so what would be
sent can be shown (``described``: tokens by name only) and tested before anything
is sent. ``send`` makes one attempt with a timeout; ``deliver`` makes a bounded
number, waiting longer between each, and retries only what may pass on its own
(no answer, a timeout, 408, 429, 5xx): a refusal (4xx) is final. Neither ever
raises for the service's part: the ``Delivery`` says what happened, so a caller
can report a failed notification without failing the work it reports on.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_ATTEMPTS = 3
BACKOFF_S = 1.0  # before the second attempt; doubled before each next one
RETRIED = frozenset({408, 429})
SCHEMES = ("http", "https")
REPLY_LIMIT = 64 * 1024  # of a reply's body kept (an API's error message)


@dataclass(frozen=True)
class Call:
    """One HTTP request, as a value."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    body: bytes = b""
    secret_headers: frozenset[str] = frozenset()  # shown by name only in ``described``

    def described(self) -> dict[str, Any]:
        """The call as JSON-ready data, the values of secret headers left out."""
        headers = {
            name: "<secret>" if name in self.secret_headers else value
            for name, value in sorted(self.headers.items())
        }
        body: Any = self.body.decode(errors="replace")
        with contextlib.suppress(ValueError):
            body = json.loads(body) if body else None
        return {"method": self.method, "url": self.url, "headers": headers, "body": body}


def json_call(
    method: str,
    url: str,
    document: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    secret_headers: frozenset[str] = frozenset(),
) -> Call:
    """A call whose body is ``document`` as compact JSON."""
    body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    merged = {"Content-Type": "application/json", **(headers or {})}
    return Call(method, url, MappingProxyType(merged), body, secret_headers)


@dataclass(frozen=True)
class Reply:
    """What one attempt got: an HTTP status and body, or no answer (``status`` None)."""

    status: int | None
    body: bytes = b""
    error: str = ""  # why there was no answer (refused, timed out)

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def passing(self) -> bool:
        """Whether another attempt may fare better (no answer, 408, 429, 5xx)."""
        return self.status is None or self.status in RETRIED or self.status >= 500

    def json(self) -> Any:
        """The body as JSON (None when it is none)."""
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    @property
    def words(self) -> str:
        """``HTTP 502``, or why nothing answered."""
        return f"HTTP {self.status}" if self.status is not None else self.error


@dataclass(frozen=True)
class Delivery:
    """Every attempt of one call, the last one deciding."""

    replies: tuple[Reply, ...]

    @property
    def ok(self) -> bool:
        """Whether the last attempt was answered 2xx."""
        return bool(self.replies) and self.replies[-1].ok

    @property
    def last(self) -> Reply:
        """The last attempt's reply."""
        return self.replies[-1]

    @property
    def words(self) -> str:
        """``delivered (HTTP 200)``, ``failed after 3 attempts: HTTP 503``."""
        if self.ok:
            return f"delivered ({self.last.words})"
        tries = len(self.replies)
        return f"failed after {tries} attempt{'s' if tries != 1 else ''}: {self.last.words}"


def url_problem(url: str) -> str | None:
    """Why ``url`` is no URL to send to (only http and https with a host, no user name or
    password in it), or None. The message never shows a password."""
    try:
        parsed = urllib.parse.urlsplit(url)
        host, _port = parsed.hostname, parsed.port
    except ValueError as exc:  # `http://[::1` (a bracket missing), a port out of range
        return f"{_shown_url(url)!r} is not a URL ({exc})"
    if parsed.scheme not in SCHEMES:
        return f"{_shown_url(url)!r} is not an http(s) URL"
    if not host:
        return f"{_shown_url(url)!r} names no host"
    if parsed.username is not None or parsed.password is not None:
        return (
            f"{_shown_url(url)!r} holds a user name or password: give the URL without it "
            "(a webhook's secret goes in $REPROMATRIX_WEBHOOK_SECRET, a token in its variable)"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return f"{_shown_url(url)!r} holds a space or a control character"
    return None


def _shown_url(url: str) -> str:
    """``url`` with anything before an ``@`` in its authority replaced (never a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url[:200]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "<userinfo>@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"[:200]


class RedirectRefused(urllib.error.URLError):
    """A redirect to another host or scheme, not followed (its reason says where)."""


class SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed only over http(s) to the host that was asked: a service's answer
    never sends a request, or the token in its headers, anywhere else."""

    def redirect_request(  # noqa: PLR0917 (urllib calls it so)
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if (why := off_host(target, req.full_url)) is not None:
            raise RedirectRefused(f"a redirect (HTTP {code}) {why}: not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def same_host_opener() -> urllib.request.OpenerDirector:
    """HTTP and HTTPS only (no ``file:``, ``ftp:`` or ``data:``), redirects kept on host."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        SameHostRedirects(),
    ):
        opener.add_handler(handler)
    return opener


def off_host(url: str, asked: str, more: tuple[str, ...] = ()) -> str | None:
    """Why ``url`` is off the host of ``asked`` (another scheme or host), or None. ``more``
    names further hosts allowed (a token service)."""
    try:
        target, origin = urllib.parse.urlsplit(url), urllib.parse.urlsplit(asked)
        port, origin_port = target.port, origin.port
    except ValueError:
        return "leads to a malformed URL"
    if target.scheme not in SCHEMES:
        return f"leads to a {target.scheme or 'relative'}: URL"
    if target.scheme == "http" and origin.scheme == "https":
        return "leads from https to http"
    same = (target.hostname, port) == (origin.hostname, origin_port)
    if not same and target.hostname not in more:
        return f"leads to another host ({target.hostname})"
    return None


def send(call: Call, timeout_s: float = DEFAULT_TIMEOUT_S) -> Reply:
    """One attempt; the reply, or no answer with why (never raises for the service's part)."""
    request = urllib.request.Request(
        call.url, data=call.body or None, headers=dict(call.headers), method=call.method
    )
    try:
        with same_host_opener().open(request, timeout=timeout_s) as response:
            return Reply(response.status, response.read(REPLY_LIMIT))
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read(REPLY_LIMIT))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Reply(None, error=f"no answer from {_where(call.url)}: {reason}")


def deliver(
    call: Call,
    attempts: int = DEFAULT_ATTEMPTS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep,
    backoff_s: float = BACKOFF_S,
) -> Delivery:
    """Up to ``attempts`` attempts, ``backoff_s`` doubling between them; stops at an answer
    that another attempt cannot change (2xx, or a refusal)."""
    replies: list[Reply] = []
    for attempt in range(max(1, attempts)):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        reply = send(call, timeout_s)
        replies.append(reply)
        if reply.ok or not reply.passing:
            break
    return Delivery(tuple(replies))


def _where(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    return f"{parsed.scheme}://{parsed.netloc}"
