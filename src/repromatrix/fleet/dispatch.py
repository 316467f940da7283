"""Cells this host cannot run, handed to the fleet: a workflow dispatch or a Buildkite build.

A ``Handoff`` is the cells of one new tag as the fleet runs them: the matrix
and scenario folder, the ``--only``/``--skip`` globs that select them, the
lock restricted to that tag (so the fleet tests the digest that was found, not
whatever the tag points at by then), and the key that names the fleet's run
(``watch-<key>``), by which its merged results are found again.

A ``Dispatcher`` starts the fleet's run of a hand-off. Two speak HTTP APIs,
each rendered as a ``http_calls.Call`` first (so ``describe`` shows exactly
what is sent, tokens by name):

- ``GitHubWorkflow``: ``POST {api}/repos/{repo}/actions/workflows/{file}/dispatches``
  runs ``compat-matrix.yml`` with the hand-off as its inputs (``only``, ``skip``,
  ``lock``, ``watch``); the API URL is configurable for GitHub Enterprise
  (``https://HOST/api/v3``).
- ``BuildkiteBuild``: ``POST {api}/v2/organizations/{org}/pipelines/{slug}/builds``
  starts a build of ``.buildkite/pipeline.yml`` with the hand-off in its
  environment (``REPROMATRIX_ONLY``, ``REPROMATRIX_LOCK_JSON``, ...).

The Slurm executor is a third ``Dispatcher`` (built on its own branch): its
``dispatch`` submits the same hand-off with ``sbatch`` and says where its
results land; nothing else here changes for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from repromatrix.http_calls import Call, Reply, deliver, json_call

GITHUB_API = "https://api.github.com"
BUILDKITE_API = "https://api.buildkite.com"
WORKFLOW = "compat-matrix.yml"
RUN_PREFIX = "watch-"  # the fleet's run of a hand-off is named watch-<key>


@dataclass(frozen=True)
class Handoff:
    """The cells of one new tag that the fleet is asked to run."""

    key: str  # the tag's key (lane, tag, digest): names the fleet's run
    lane: str
    tag: str
    matrix: str  # as the fleet's checkout reads it
    scenarios: str
    only: tuple[str, ...]
    skip: tuple[str, ...]
    lock: str  # the lock file's JSON text, of this tag only
    cells: int
    package: str = "."  # what the fleet's jobs pip-install as repromatrix

    @property
    def name(self) -> str:
        """The fleet run's name: ``watch-<key>``."""
        return RUN_PREFIX + self.key


@dataclass(frozen=True)
class Dispatched:
    """What a dispatch did: whether the fleet took it, its words, where to follow it."""

    ok: bool
    words: str
    url: str | None = None  # the build's page, when the API says it
    fleet_id: str | None = None  # what the fleet's results are fetched by (a build's id)


class Dispatcher(Protocol):
    """Starts the fleet's run of a hand-off."""

    @property
    def name(self) -> str:
        """The fleet's name in the hand-off's record (``github``, ``buildkite``, ``slurm``)."""

    def describe(self, handoff: Handoff) -> dict[str, Any]:
        """What ``dispatch`` would do, as JSON-ready data (no secret values)."""

    def dispatch(self, handoff: Handoff) -> Dispatched:
        """Start the fleet's run; never raises for the fleet's part."""


@dataclass(frozen=True)
class GitHubWorkflow:
    """``compat-matrix.yml`` run through the GitHub Actions API (workflow_dispatch)."""

    repo: str  # owner/name
    token: str
    ref: str = "main"
    workflow: str = WORKFLOW
    api: str = GITHUB_API
    name: str = "github"

    def call(self, handoff: Handoff) -> Call:
        """The dispatch request: the hand-off as the workflow's inputs."""
        url = f"{self.api.rstrip('/')}/repos/{self.repo}/actions/workflows/{self.workflow}"
        inputs = {
            "matrix": handoff.matrix,
            "scenarios": handoff.scenarios,
            "only": " ".join(handoff.only),
            "skip": " ".join(handoff.skip),
            "lock": handoff.lock,
            "watch": handoff.key,
            "package": handoff.package,
        }
        return json_call(
            "POST",
            f"{url}/dispatches",
            {"ref": self.ref, "inputs": inputs},
            github_headers(self.token),
            frozenset({"Authorization"}),
        )

    def describe(self, handoff: Handoff) -> dict[str, Any]:
        """The request, its token by name."""
        return {"dispatcher": self.name, **self.call(handoff).described()}

    def dispatch(self, handoff: Handoff) -> Dispatched:
        """Send the dispatch; GitHub answers 204 with no run id (the run is named by key)."""
        delivery = deliver(self.call(handoff))
        words = f"{self.workflow} on {self.ref} of {self.repo}, run {handoff.name}"
        return _dispatched(delivery.last, delivery.words, words)


@dataclass(frozen=True)
class BuildkiteBuild:
    """A build of the compatibility pipeline through the Buildkite REST API."""

    organization: str
    pipeline: str
    token: str
    branch: str = "main"
    api: str = BUILDKITE_API
    name: str = "buildkite"

    def call(self, handoff: Handoff) -> Call:
        """The create-build request: the hand-off in the build's environment."""
        url = (
            f"{self.api.rstrip('/')}/v2/organizations/{self.organization}"
            f"/pipelines/{self.pipeline}/builds"
        )
        env = {
            "REPROMATRIX_MATRIX": handoff.matrix,
            "REPROMATRIX_SCENARIOS": handoff.scenarios,
            "REPROMATRIX_ONLY": " ".join(handoff.only),
            "REPROMATRIX_SKIP": " ".join(handoff.skip),
            "REPROMATRIX_LOCK_JSON": handoff.lock,
            "REPROMATRIX_WATCH": handoff.key,
            "REPROMATRIX_PACKAGE": handoff.package,
        }
        document = {
            "commit": "HEAD",
            "branch": self.branch,
            "message": f"repromatrix watch: {handoff.lane} {handoff.tag} ({handoff.name})",
            "env": env,
        }
        headers = {"Authorization": f"Bearer {self.token}"}
        return json_call("POST", url, document, headers, frozenset({"Authorization"}))

    def describe(self, handoff: Handoff) -> dict[str, Any]:
        """The request, its token by name."""
        return {"dispatcher": self.name, **self.call(handoff).described()}

    def dispatch(self, handoff: Handoff) -> Dispatched:
        """Create the build; Buildkite answers 201 with its number and page."""
        delivery = deliver(self.call(handoff))
        answer = delivery.last.json() if delivery.ok else None
        build = answer if isinstance(answer, dict) else {}
        words = f"{self.organization}/{self.pipeline} build {build.get('number', '?')} "
        words += f"({handoff.name})"
        return _dispatched(delivery.last, delivery.words, words, build)


def github_headers(token: str) -> dict[str, str]:
    """The headers of a GitHub REST API call."""
    return {
        "Accept": "application/vnd.github+json",
        "Authorization": f"Bearer {token}",
        "X-GitHub-Api-Version": "2022-11-28",
    }


def _dispatched(
    last: Reply, delivery: str, words: str, build: dict[str, Any] | None = None
) -> Dispatched:
    if last.ok:
        found = build or {}
        page, fleet_id = found.get("web_url"), found.get("id")
        return Dispatched(
            True,
            words,
            page if isinstance(page, str) else None,
            fleet_id if isinstance(fleet_id, str) else None,
        )
    detail = last.body.decode(errors="replace")[:300].strip()
    return Dispatched(False, f"{words}: {delivery}" + (f": {detail}" if detail else ""))
