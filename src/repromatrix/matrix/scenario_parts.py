"""The smaller parts of a scenario file: signatures, reached evidence, source, probe and
container options.

``scenarios`` reads the file as a whole; these readers record their problems in
the same ``Reader``, so every problem of a file is still reported at once.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from repromatrix.errors import suggest
from repromatrix.matrix import env
from repromatrix.matrix.keys import IMAGE_VARIANTS, REACHED_FACT, section
from repromatrix.matrix.lanes import SHM_PATTERN
from repromatrix.matrix.yamlsrc import Reader, YMap, YNode, YScalar, YSeq, describe
from repromatrix.patterns import regex_problem
from repromatrix.values import ContainerOptions, Evidence, FactTest, Lane, Probe, Signature, Source
from repromatrix.vllm_facts import FACTS
from repromatrix.vllm_processes import KNOWN_PROCESSES, same_process

PROGRAM_PATTERN = re.compile(r"[a-z][a-z0-9_]*\.py")


def read_signatures(node: YNode | None, reader: Reader) -> tuple[Signature, ...]:
    """The ``signatures`` list: patterns that compile, processes vLLM prints."""
    if node is None:
        return ()
    signatures = []
    for item in reader.sequence(node, "`signatures`") or ():
        body = reader.mapping(item, "a signature")
        if body is None:
            continue
        keys = section("signature")
        reader.keys(body, keys.names, "a signature", required=keys.required)
        pattern = read_pattern(body.get("pattern"), "`pattern`", reader)
        beside_node = body.get("beside")
        beside = read_pattern(beside_node, "`beside`", reader) if beside_node else None
        if pattern is not None and (beside_node is None or beside is not None):
            process = _process(body.get("process"), "a signature's", reader)
            signatures.append(Signature(pattern, process, beside))
    if not signatures and isinstance(node, YSeq) and not node.items:
        reader.error(node.where, "`signatures` must list at least one pattern")
    return tuple(signatures)


def read_reached(node: YNode | None, reader: Reader) -> tuple[Evidence, ...]:
    """The ``reached`` list: log lines (as signatures are written) or tests of a fact."""
    if node is None:
        return ()
    found: list[Evidence] = []
    for item in reader.sequence(node, "`reached`") or ():
        body = reader.mapping(item, "a `reached` entry")
        if body is None:
            continue
        reader.keys(body, section("reached").names, "a `reached` entry")
        evidence = _fact_test(body, reader) if "fact" in _keys(body) else _line(body, reader)
        if evidence is not None:
            found.append(evidence)
    if not found and isinstance(node, YSeq) and not node.items:
        reader.error(node.where, "`reached` must list at least one line or fact (or be left out)")
    return tuple(found)


def _keys(body: YMap) -> set[str]:
    return {entry.key for entry in body}


def _line(body: YMap, reader: Reader) -> Signature | None:
    """A ``reached`` log line: ``pattern`` and, optionally, the ``process`` printing it."""
    if "pattern" not in _keys(body):
        reader.error(body.where, "a `reached` entry needs `pattern` (a log line) or `fact`")
        return None
    pattern = _pattern(body, "pattern", reader)
    process = _process(body.get("process"), "a `reached` line's", reader)
    return Signature(pattern, process) if pattern is not None else None


def _fact_test(body: YMap, reader: Reader) -> FactTest | None:
    """A ``reached`` fact: a name triage reads, with exactly one of ``equals`` or ``matches``."""
    keys = _keys(body)
    for key in ("pattern", "process"):
        if (node := body.get(key)) is not None:
            reader.error(node.where, f"`{key}` belongs to a log line, not to a `fact` entry")
    tests = [key for key in REACHED_FACT[1:] if key in keys]
    if len(tests) != 1:
        reader.error(body.where, "a `fact` entry needs exactly one of `equals` or `matches`")
    fact = _text(body, "fact", reader)
    if fact is not None and fact not in FACTS:
        node = body.get("fact") or body
        message = f"unknown fact `{fact}`: triage reads {', '.join(FACTS)}."
        reader.error(node.where, message + suggest(fact, FACTS))
        fact = None
    equals = _equals(body.get("equals"), reader)
    matches = _pattern(body, "matches", reader) if "matches" in keys else None
    if fact is None or len(tests) != 1 or (equals is None and matches is None):
        return None
    return FactTest(fact, equals=equals, matches=matches)


def _equals(node: YNode | None, reader: Reader) -> str | None:
    """The value a fact must equal: text or a number, compared as the text vLLM prints."""
    if node is None:
        return None
    value = node.value if isinstance(node, YScalar) else None
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    reader.error(node.where, f"`equals` must be text or a number, not {describe(node)}")
    return None


def _pattern(body: YMap, key: str, reader: Reader) -> str | None:
    """``body``'s ``key`` as a regular expression (``read_pattern``)."""
    return read_pattern(body.get(key), f"`{key}`", reader)


def read_pattern(node: YNode | None, what: str, reader: Reader) -> str | None:
    """A regular expression searched in log lines: one RE2 takes (``patterns.py``)."""
    if node is None:
        return None
    pattern = reader.text(node, what)
    if pattern is None:
        return None
    if (why := regex_problem(pattern)) is not None:
        reader.error(node.where, f"{what} is {why}")
        return None
    return pattern


# A backslash and the character it escapes, as a regular expression writes it (``\.``).
ESCAPE = re.compile(r"\\(.)", re.DOTALL)
# What only a pattern writes outside its escapes: a repeat of any character (``.*``, ``.+``)
# or an anchor at either end (``^...``, ``...$``).
UNESCAPED_PATTERN = re.compile(r"\.[*+]|^\^|\$$")


def read_line_text(node: YNode | None, what: str, reader: Reader) -> str | None:
    r"""Text a line of vLLM's output holds (``interrupt_on``): matched as text, by the harness
    inside the image, where no pattern is matched (``patterns.py``). A backslash before
    punctuation is dropped, as a pattern escapes it (``\.\.\.`` is ``...``); what only a
    pattern writes (``\d``, ``.*``, an anchor) is refused with the fix."""
    if node is None:
        return None
    written = reader.text(node, what)
    if written is None:
        return None
    if (found := pattern_only(written)) is not None:
        reader.error(
            node.where,
            f"{what} is text a line of vLLM's output holds, matched as text in the image, "
            f"not a pattern: `{found}` is a regular expression's; write the line's own words "
            "(a backslash before punctuation is dropped, as a pattern escapes it)",
        )
        return None
    text = ESCAPE.sub(lambda m: m.group(1), written)
    if not text.strip():
        reader.error(node.where, f"{what} must hold some text (an empty one is in every line)")
        return None
    return text


def pattern_only(written: str) -> str | None:
    """The first thing in ``written`` only a regular expression writes (a class such as
    ``\\d``, ``.*``, an anchor), or None."""
    for escape in ESCAPE.finditer(written):
        if escape.group(1).isalnum():
            return escape.group(0)
    found = UNESCAPED_PATTERN.search(ESCAPE.sub("\0", written))  # an escape is text
    return found.group(0) if found else None


def read_env(node: YNode | None, what: str, reader: Reader) -> dict[str, str]:
    """Environment variables: valid names, values by their grammar, never a secret (those
    reach a cell from the host at run time only); ``env.read_env``."""
    return env.read_env(node, what, reader)


def _process(node: YNode | None, whose: str, reader: Reader) -> str | None:
    """A process name that matches some process vLLM prints (``EngineCore``, ``Worker``...)."""
    if node is None:
        return None
    name = reader.text(node, "`process`")
    if name is None or any(same_process(name, known) for known in KNOWN_PROCESSES):
        return name
    reader.error(
        node.where,
        f"unknown process `{name}`: {whose} process is one vLLM prints, such as "
        f"APIServer, EngineCore, Worker or VllmWorker.{suggest(name, KNOWN_PROCESSES)}",
    )
    return None


def read_source(node: YNode | None, reader: Reader) -> Source:
    """The ``source`` mapping: seed file, issues, PRs."""
    body = reader.mapping(node, "`source`") if node is not None else None
    if body is None:
        return Source()
    reader.keys(body, section("source").names, "`source`")
    return Source(
        seed=_text(body, "seed", reader),
        issues=_numbers(body.get("issues"), "`issues`", reader),
        prs=_numbers(body.get("prs"), "`prs`", reader),
    )


def _numbers(node: YNode | None, what: str, reader: Reader) -> tuple[int, ...]:
    items = reader.sequence(node, what) if node is not None else ()
    numbers = (reader.integer(item, f"{what} entry", minimum=1) for item in items or ())
    return tuple(n for n in numbers if n is not None)


def read_probe(node: YNode | None, reader: Reader) -> Probe | None:
    """The ``probe`` mapping: a program under probes/, its params, lanes and note."""
    body = reader.mapping(node, "`probe`") if node is not None else None
    if body is None:
        return None
    keys = section("probe")
    reader.keys(body, keys.names, "`probe`", required=keys.required)
    program = _text(body, "program", reader)
    if program is not None and not PROGRAM_PATTERN.fullmatch(program):
        where = (body.get("program") or body).where
        reader.error(where, "`program` must be a file name under probes/, like moe_lora_rank.py")
        program = None
    params_node = body.get("params")
    params = reader.flags(params_node, "`params`") if params_node is not None else None
    lanes = read_lanes(body.get("lanes"), "probe `lanes`", reader)
    if program is None:
        return None
    note = _text(body, "note", reader) or ""
    return Probe(program, MappingProxyType(dict(params or {})), lanes, note)


def read_lanes(
    node: YNode | None, what: str, reader: Reader, allow_empty: bool = False
) -> tuple[Lane, ...]:
    """A list of lanes, each once (``cpu``, ``gpu``); empty only where ``allow_empty``."""
    if node is None:
        return ()
    if isinstance(node, YSeq) and not node.items and allow_empty:
        return ()
    lanes: list[Lane] = []
    for item in reader.sequence(node, what) or ():
        value = item.value if isinstance(item, YScalar) else None
        if isinstance(value, str) and value in set(Lane) and Lane(value) not in lanes:
            lanes.append(Lane(value))
        else:
            reader.error(item.where, f"{what} must list `cpu` and/or `gpu` once each")
    if not lanes and not allow_empty:
        reader.error(node.where, f"{what} must name at least one lane")
    return tuple(lanes)


def _text(body: YMap, key: str, reader: Reader) -> str | None:
    node = body.get(key)
    return reader.text(node, f"`{key}`") if node is not None else None


def read_container(node: YNode | None, reader: Reader) -> ContainerOptions:
    """The ``container`` mapping of a launch or a variant: shm, memory, port, image variant."""
    body = reader.mapping(node, "`container`") if node is not None else None
    if body is None:
        return ContainerOptions()
    keys = section("container")
    reader.keys(body, keys.names, "`container`")
    port_node, image_node = body.get("port_taken"), body.get("image")
    # `image: null` in a variant asks for the lane's normal image over the launch's variant.
    normal = isinstance(image_node, YScalar) and image_node.value is None
    image = "" if normal else _text(body, "image", reader)
    if image and image not in IMAGE_VARIANTS:
        hint = suggest(image, IMAGE_VARIANTS)
        assert image_node is not None
        reader.error(
            image_node.where,
            f"unknown image variant `{image}`: one of {', '.join(IMAGE_VARIANTS)}.{hint}",
        )
        image = None
    return ContainerOptions(
        shm_size=_size(body.get("shm_size"), "shm_size", reader),
        memory=_size(body.get("memory"), "memory", reader),
        port_taken=reader.boolean(port_node, "`port_taken`") if port_node is not None else None,
        image=image,
    )


def _size(node: YNode | None, key: str, reader: Reader) -> str | None:
    if node is None:
        return None
    value = node.value if isinstance(node, YScalar) else None
    text = str(value).lower() if isinstance(value, str | int) and value is not True else ""
    if SHM_PATTERN.fullmatch(text):
        return text
    reader.error(node.where, f"`{key}` must be a size like `2g` or `512m`, not {describe(node)}")
    return None
