"""A local OCI registry on the loopback (Debian's ``docker-registry``), started and stopped here.

The packaged default configuration listens on every interface and asks for
htpasswd authentication; this one listens on 127.0.0.1 only, stores under a
folder of ours, and needs no authentication (Docker trusts loopback registries
without TLS).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from repromatrix.errors import InfraError

PROGRAM = "docker-registry"
START_S = 30.0
HTTP_NOT_FOUND = 404
CONFIG = """version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@dataclass(frozen=True)
class LocalRegistry:
    """A running registry: its address and where it stores images."""

    host: str  # 127.0.0.1:5000
    root: Path

    def url(self, path: str) -> str:
        """The registry API's URL for ``path`` (``/v2/...``)."""
        return f"http://{self.host}{path}"

    def tags(self, repository: str) -> list[str]:
        """The tags of ``repository``, from the registry's own tag list (none if unknown)."""
        try:
            with urllib.request.urlopen(self.url(f"/v2/{repository}/tags/list"), timeout=10) as r:
                return list(json.load(r).get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == HTTP_NOT_FOUND:
                return []
            raise


def answers(host: str) -> bool:
    """Whether a registry answers the version check at ``host``."""
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def local_registry(root: Path, port: int = 5000) -> Iterator[LocalRegistry]:
    """Start a registry on ``127.0.0.1:port`` storing under ``root``; stop it on exit.

    A registry that already answers there is used as it is (and left running).
    """
    host = f"127.0.0.1:{port}"
    if answers(host):
        yield LocalRegistry(host, root)
        return
    program = shutil.which(PROGRAM)
    if program is None:
        raise InfraError(f"no `{PROGRAM}` here: `apt-get install -y docker-registry` installs it")
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(CONFIG.format(root=root / "storage", port=port), encoding="utf-8")
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([program, "serve", str(config)], stdout=log, stderr=log)
    try:
        _wait_until_it_answers(host, proc, root / "registry.log")
        yield LocalRegistry(host, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_until_it_answers(host: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if answers(host):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1000:]
    raise InfraError(f"the local registry did not answer on {host}:\n{tail}")
