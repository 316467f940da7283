"""A GPU lane's registry over its HTTP API: the tag list, and the digest a tag points at.

``GET /v2/<name>/tags/list`` is the OCI distribution API every registry
serves: Docker Hub (behind a bearer-token challenge), a private registry, or a
local one on 127.0.0.1:5000. Loopback registries are spoken to in plain HTTP
(as Docker itself does); every other one in HTTPS. Long lists come in pages
linked by the ``Link`` header. ``HEAD /v2/<name>/manifests/<tag>`` answers the
digest a tag points at now (``Docker-Content-Digest``), the one ``docker pull``
records, so a moved tag shows as a new digest without pulling anything.

A registry's answers are data from elsewhere, and they never lead the tool off
the registry: a ``Link`` to the next page, a redirect and a bearer challenge's
``realm`` are followed only over http(s) to the registry's own host (or a token
service known for it, ``AUTH_HOSTS``, or one the user names in
``REPROMATRIX_REGISTRY_HOSTS``); nothing else is ever opened (the opener has no
``file:`` or ``ftp:`` handler). Each answer is read up to ``MAX_BODY`` bytes,
a tag list up to ``MAX_TAGS`` tags, and every error text is redacted.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from repromatrix.errors import InfraError, UsageError
from repromatrix.grammars import check_tag, load_json
from repromatrix.http_calls import RedirectRefused, off_host, same_host_opener
from repromatrix.secret_env import redact_text

DOCKER_HUB = "registry-1.docker.io"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
PAGE = 1000
MAX_PAGES = 100
MAX_TAGS = 100_000  # of one repository: Docker Hub's vllm/vllm-openai has a few hundred
MAX_BODY = 16 * 1024 * 1024  # bytes of one answer: a page of 1000 tags is some 20 KiB
ERROR_TEXT = 300  # characters of an error answer quoted
SCHEMES = ("http", "https")
# Token services a registry may send a bearer challenge to, besides the registry's own host.
AUTH_HOSTS = {DOCKER_HUB: ("auth.docker.io",)}
HOSTS_ENV = "REPROMATRIX_REGISTRY_HOSTS"  # more such hosts, comma-separated (the user's)
TIMEOUT_S = 30
NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Every manifest kind a tag may point at: a multi-platform index is what ``docker pull``
# records for such a tag, so it is asked for first.
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


@dataclass(frozen=True)
class Repository:
    """Where a registry reference points: the registry host and the repository name."""

    host: str
    name: str

    @property
    def base(self) -> str:
        """``http://127.0.0.1:5000`` or ``https://registry-1.docker.io``."""
        name = self.host.rpartition(":")[0] if self.host.count(":") == 1 else self.host
        if self.host.startswith("[") and "]:" in self.host:
            name = self.host.rpartition(":")[0]
        scheme = "http" if name in LOOPBACK or self.host in LOOPBACK else "https"
        return f"{scheme}://{self.host}"


def parse_repository(ref: str) -> Repository:
    """``vllm/vllm-openai`` (Docker Hub) or ``127.0.0.1:5000/vllm/vllm-openai`` (that registry)."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, name = first, rest
    else:
        host, name = DOCKER_HUB, ref
    if host in ("docker.io", "index.docker.io"):
        host = DOCKER_HUB
    if host == DOCKER_HUB and "/" not in name:
        name = f"library/{name}"
    return Repository(host, name)


class Fetch(Protocol):
    """(url, headers, method) -> (status, headers, body); tests use a server, not a fake."""

    def __call__(
        self, url: str, headers: Mapping[str, str], method: str = "GET"
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send one request; an HTTP error status is an answer too."""


class LeadsOff(InfraError):
    """A registry's answer that would take the tool to another host or scheme."""


def http_fetch(
    url: str, headers: Mapping[str, str], method: str = "GET"
) -> tuple[int, Mapping[str, str], bytes]:
    """GET (or HEAD) ``url``; return the status, headers and body (an HTTP error status is
    returned too). Redirects stay on the host; a body over ``MAX_BODY`` is an ``InfraError``."""
    request = urllib.request.Request(url, headers=dict(headers), method=method)
    try:
        with same_host_opener().open(request, timeout=TIMEOUT_S) as response:
            return response.status, dict(response.headers.items()), _bounded(response, url)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:  # one urllib would not follow (to a scheme it refuses)
            where = f"registry {_where(url)}: a redirect (HTTP {exc.code})"
            raise LeadsOff(f"{where}: not followed") from None
        return exc.code, dict(exc.headers.items()), _bounded(exc, url)
    except RedirectRefused as exc:
        raise LeadsOff(redact_text(f"registry {_where(url)}: {exc.reason}")) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise InfraError(redact_text(f"registry {_where(url)}: {exc}")) from exc


def _bounded(response: Any, url: str) -> bytes:
    body: bytes = response.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise InfraError(f"registry {_where(url)}: an answer of more than {MAX_BODY} bytes")
    return body


def _where(url: str) -> str:
    """``https://host:port/path`` without query or userinfo: what an error names."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a malformed URL)"
    return redact_text(f"{parts.scheme}://{host}{port}{parts.path}"[:200])


def list_tags(ref: str, fetch: Fetch = http_fetch, page: int = PAGE) -> tuple[str, ...]:
    """Every tag of the repository ``ref`` names, in the registry's order (``page`` a request):
    at most ``MAX_PAGES`` pages and ``MAX_TAGS`` tags, each page on the registry's host."""
    repository = parse_repository(ref)
    url = f"{repository.base}/v2/{repository.name}/tags/list?n={page}"
    headers: dict[str, str] = {"Accept": "application/json"}
    tags: list[str] = []
    for _ in range(MAX_PAGES):
        status, answer, body = fetch(url, headers)
        if status == 401 and "Authorization" not in headers:
            headers["Authorization"] = _bearer(answer, fetch, repository)
            status, answer, body = fetch(url, headers)
        if status != 200:
            raise InfraError(f"registry {_where(url)}: HTTP {status}: {_error_text(body)}")
        tags += _tags(body, url)
        if len(tags) > MAX_TAGS:
            raise InfraError(f"registry {repository.host}: more than {MAX_TAGS} tags")
        link = _header(answer, "Link")
        found = NEXT.search(link) if link else None
        if found is None:
            return tuple(tags)
        following = urllib.parse.urljoin(url, found.group(1))
        if (why := off_host(following, url)) is not None:
            raise LeadsOff(f"registry {_where(url)}: its next page {why}: not followed")
        url = following
    raise InfraError(f"registry {repository.host}: more than {MAX_PAGES} pages of tags")


def _error_text(body: bytes) -> str:
    return redact_text(body[: ERROR_TEXT * 4].decode(errors="replace")[:ERROR_TEXT])


def tag_digest(ref: str, tag: str, fetch: Fetch = http_fetch) -> str:
    """The digest (``sha256:...``) tag ``tag`` of the repository ``ref`` points at now."""
    if (why := check_tag(tag)) is not None:
        raise UsageError(f"image tag {tag[:80]!r} is refused: {why}")
    repository = parse_repository(ref)
    url = f"{repository.base}/v2/{repository.name}/manifests/{tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    status, answer, body = fetch(url, headers, "HEAD")
    if status == 401:
        headers["Authorization"] = _bearer(answer, fetch, repository)
        status, answer, body = fetch(url, headers, "HEAD")
    digest = _header(answer, "Docker-Content-Digest") if status == 200 else None
    if status == 200 and digest is None:  # a registry that leaves the header out of HEAD
        status, answer, body = fetch(url, headers, "GET")
        digest = "sha256:" + hashlib.sha256(body).hexdigest() if status == 200 else None
    if status != 200:
        raise InfraError(f"registry {_where(url)}: HTTP {status}")
    if digest is None or not DIGEST.fullmatch(digest):
        shown = redact_text(repr(digest)[:100])
        raise InfraError(f"registry {_where(url)}: no sha256 digest in its answer ({shown})")
    return digest


def _tags(body: bytes, url: str) -> list[str]:
    try:
        data: Any = load_json(body)
    except (ValueError, RecursionError) as exc:
        raise InfraError(f"registry {_where(url)}: not JSON: {str(exc)[:200]}") from exc
    tags = data.get("tags") if isinstance(data, dict) else None
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise InfraError(f"registry {_where(url)}: `tags` is not a list of names")
    return list(tags)


def _bearer(headers: Mapping[str, str], fetch: Fetch, repository: Repository) -> str:
    """Answer a ``WWW-Authenticate: Bearer realm=...`` challenge with an anonymous token; the
    realm is asked only over http(s) on the registry's host or a token service allowed for it."""
    challenge = (_header(headers, "WWW-Authenticate") or "")[:2000]
    shown = redact_text(repr(challenge)[:300])
    if not challenge.lower().startswith("bearer "):
        raise InfraError(f"registry asks for credentials this tool does not have: {shown}")
    fields = dict(CHALLENGE.findall(challenge))
    realm = fields.pop("realm", "")
    if not realm:
        raise InfraError(f"registry challenge without a realm: {shown}")
    if (why := off_host(realm, repository.base, auth_hosts(repository.host))) is not None:
        raise LeadsOff(f"registry {repository.host}: its token service {why}: not asked")
    status, _, body = fetch(f"{realm}?{urllib.parse.urlencode(fields)}", {})
    try:
        answer = load_json(body) if status == 200 else None
    except (ValueError, RecursionError):
        answer = None
    token = answer.get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token.isprintable():
        raise InfraError(f"registry token service {_where(realm)}: HTTP {status}")
    return f"Bearer {token}"


def auth_hosts(host: str) -> tuple[str, ...]:
    """The token services a registry may send a challenge to, besides its own host."""
    named = os.environ.get(HOSTS_ENV, "")
    return (*AUTH_HOSTS.get(host, ()), *(h.strip() for h in named.split(",") if h.strip()))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None
