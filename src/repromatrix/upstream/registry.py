"""A GPU lane's registry over its HTTP API: the tag list, and the digest a tag points at.

``GET /v2/<name>/tags/list`` is the OCI distribution API every registry
serves: Docker Hub (behind a bearer-token challenge), a private registry, or a
local one on 127.0.0.1:5000. Loopback registries are spoken to in plain HTTP
(as Docker itself does); every other one in HTTPS. Long lists come in pages
linked by the ``Link`` header. ``HEAD /v2/<name>/manifests/<tag>`` answers the
digest a tag points at now (``Docker-Content-Digest``), the one ``docker pull``
records, so a moved tag shows as a new digest without pulling anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from repromatrix.errors import InfraError

DOCKER_HUB = "registry-1.docker.io"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
PAGE = 1000
MAX_PAGES = 100
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


def http_fetch(
    url: str, headers: Mapping[str, str], method: str = "GET"
) -> tuple[int, Mapping[str, str], bytes]:
    """GET (or HEAD) ``url``; return the status, headers and body (an HTTP error status is
    returned too)."""
    request = urllib.request.Request(url, headers=dict(headers), method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise InfraError(f"registry {url}: {exc}") from exc


def list_tags(ref: str, fetch: Fetch = http_fetch, page: int = PAGE) -> tuple[str, ...]:
    """Every tag of the repository ``ref`` names, in the registry's order (``page`` a request)."""
    repository = parse_repository(ref)
    url = f"{repository.base}/v2/{repository.name}/tags/list?n={page}"
    headers: dict[str, str] = {"Accept": "application/json"}
    tags: list[str] = []
    for _ in range(MAX_PAGES):
        status, answer, body = fetch(url, headers)
        if status == 401 and "Authorization" not in headers:
            headers["Authorization"] = _bearer(answer, fetch)
            status, answer, body = fetch(url, headers)
        if status != 200:
            text = body.decode(errors="replace")[:300]
            raise InfraError(f"registry {url}: HTTP {status}: {text}")
        tags += _tags(body, url)
        link = _header(answer, "Link")
        found = NEXT.search(link) if link else None
        if found is None:
            return tuple(tags)
        url = urllib.parse.urljoin(url, found.group(1))
    raise InfraError(f"registry {repository.host}: more than {MAX_PAGES} pages of tags")


def tag_digest(ref: str, tag: str, fetch: Fetch = http_fetch) -> str:
    """The digest (``sha256:...``) tag ``tag`` of the repository ``ref`` points at now."""
    repository = parse_repository(ref)
    url = f"{repository.base}/v2/{repository.name}/manifests/{tag}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    status, answer, body = fetch(url, headers, "HEAD")
    if status == 401:
        headers["Authorization"] = _bearer(answer, fetch)
        status, answer, body = fetch(url, headers, "HEAD")
    digest = _header(answer, "Docker-Content-Digest") if status == 200 else None
    if status == 200 and digest is None:  # a registry that leaves the header out of HEAD
        status, answer, body = fetch(url, headers, "GET")
        digest = "sha256:" + hashlib.sha256(body).hexdigest() if status == 200 else None
    if status != 200:
        raise InfraError(f"registry {url}: HTTP {status}")
    if digest is None or not DIGEST.fullmatch(digest):
        raise InfraError(f"registry {url}: no sha256 digest in its answer ({digest!r})")
    return digest


def _tags(body: bytes, url: str) -> list[str]:
    try:
        data: Any = json.loads(body)
    except ValueError as exc:
        raise InfraError(f"registry {url}: not JSON: {exc}") from exc
    tags = data.get("tags") if isinstance(data, dict) else None
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise InfraError(f"registry {url}: `tags` is not a list of names")
    return list(tags)


def _bearer(headers: Mapping[str, str], fetch: Fetch) -> str:
    """Answer a ``WWW-Authenticate: Bearer realm=...`` challenge with an anonymous token."""
    challenge = _header(headers, "WWW-Authenticate") or ""
    if not challenge.lower().startswith("bearer "):
        raise InfraError(f"registry asks for credentials this tool does not have: {challenge!r}")
    fields = dict(CHALLENGE.findall(challenge))
    realm = fields.pop("realm", "")
    if not realm:
        raise InfraError(f"registry challenge without a realm: {challenge!r}")
    status, _, body = fetch(f"{realm}?{urllib.parse.urlencode(fields)}", {})
    token = json.loads(body).get("token") if status == 200 else None
    if not isinstance(token, str):
        raise InfraError(f"registry token service {realm}: HTTP {status}")
    return f"Bearer {token}"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None
