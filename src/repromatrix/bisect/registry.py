"""The tag list of a GPU lane's registry, read over the registry's HTTP API.

``GET /v2/<name>/tags/list`` is the OCI distribution API every registry
serves: Docker Hub (behind a bearer-token challenge), a private registry, or a
local one on 127.0.0.1:5000. Loopback registries are spoken to in plain HTTP
(as Docker itself does); every other one in HTTPS. Long lists come in pages
linked by the ``Link`` header.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from repromatrix.errors import InfraError

DOCKER_HUB = "registry-1.docker.io"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
PAGE = 1000
MAX_PAGES = 100
TIMEOUT_S = 30
NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


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


# (url, headers) -> (status, headers, body); tests never need to replace it: they use a server.
Fetch = Callable[[str, Mapping[str, str]], tuple[int, Mapping[str, str], bytes]]


def http_fetch(url: str, headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
    """GET ``url``; return the status, headers and body (an HTTP error status is returned too)."""
    request = urllib.request.Request(url, headers=dict(headers))
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
