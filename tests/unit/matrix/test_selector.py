"""Selecting cells by glob (*, ?, [..], {a,b}): --only keeps, --skip drops; pruning is sound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repromatrix.errors import UsageError
from repromatrix.matrix import selector as selector_module
from repromatrix.matrix.selector import Selector, expand_braces

ID = "gpu/v0.31.0/h100/qwen3-30b-a3b/default/moe-lora-rank-over-128/trigger"
PROBE = "cpu/0.31.0/cpu/tiny-moe/default/moe-lora-rank-over-128/rank-128@probe"


def test_brace_expansion() -> None:
    assert expand_braces("a{b,c}d") == ["abd", "acd"]
    assert expand_braces("{x,y{1,2}}/z") == ["x/z", "y1/z", "y2/z"]
    assert expand_braces("{a,}b") == ["ab", "b"]
    assert expand_braces("{single}") == ["{single}"]  # no comma: literal, as in the shell
    assert expand_braces("{a,b") == ["{a,b"]  # unbalanced: literal
    assert expand_braces("{a}{b,c}") == ["{a}b", "{a}c"]


def test_brace_bomb_is_refused() -> None:
    with pytest.raises(UsageError, match="expands to over"):
        expand_braces("{a,b}" * 20)


def test_globs() -> None:
    assert Selector(["*moe-lora*"]).matches(ID)
    assert Selector(["gpu/v0.31.?/*"]).matches(ID)
    assert Selector(["gpu/v0.3[01].0/*"]).matches(ID)
    assert not Selector(["gpu/v0.3[!1].0/*"]).matches(ID)
    assert Selector(["gpu/{v0.31.0,v0.32.0}/h100/*"]).matches(ID)
    assert not Selector(["gpu/{v0.30.0,v0.32.0}/h100/*"]).matches(ID)
    assert Selector(["*@probe"]).matches(PROBE) and not Selector(["*@probe"]).matches(ID)
    assert not Selector(["gpu/v0.31.0"]).matches(ID)  # a glob matches the whole id


def test_only_and_skip() -> None:
    selector = Selector(only=["gpu/*", "cpu/*"], skip=["*/rank-128*", "*/nightly/*"])
    assert selector.matches(ID)
    assert not selector.matches(PROBE)
    assert not selector.matches(ID.replace("v0.31.0", "nightly"))
    assert Selector().matches(ID) and Selector().selects_all
    assert not Selector(skip=["*"]).matches(ID)


def test_empty_globs_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--only needs a glob"):
        Selector(only=[""])
    with pytest.raises(UsageError, match="--skip needs a glob"):
        Selector(skip=["  "])


def test_could_select_prunes_whole_branches() -> None:
    selector = Selector(only=["gpu/{v0.31.0,v0.32.0}/*"], skip=["gpu/v0.32.0/rtx-a6000/*"])
    assert not selector.could_select("cpu/")
    assert not selector.could_select("gpu/v0.22.1/")
    assert selector.could_select("gpu/")
    assert selector.could_select("gpu/v0.31.0/h100/")
    assert not selector.could_select("gpu/v0.32.0/rtx-a6000/gemma/default/")
    assert selector.could_select("gpu/v0.32.0/h100/")


def test_unmatched_only() -> None:
    selector = Selector(only=["gpu/*", "tpu/*"])
    assert selector.unmatched_only([ID, PROBE]) == ("tpu/*",)


PART = st.sampled_from(["gpu", "cpu", "v0.31.0", "h100", "a", "b-c", "x.y", "trigger", "@probe"])
GLOB_CHARS = st.sampled_from(
    ["*", "?", "/", "a", "b", "gpu", "cpu", "v0.3", "{a,b}", "[ab]", "-", "."]
)


@given(
    parts=st.lists(PART, min_size=1, max_size=7),
    cut=st.integers(1, 7),  # expansion asks from the lane down: `lane/`, ...
    only=st.lists(st.lists(GLOB_CHARS, min_size=1, max_size=6).map("".join), max_size=2),
    skip=st.lists(st.lists(GLOB_CHARS, min_size=1, max_size=6).map("".join), max_size=2),
)
def test_pruning_never_drops_a_selected_id(
    parts: list[str], cut: int, only: list[str], skip: list[str]
) -> None:
    cell_id = "/".join(parts)
    prefix = "/".join(parts[:cut]) + "/" if cut < len(parts) else cell_id
    selector = Selector(only, skip)
    if selector.matches(cell_id):
        assert selector.could_select(prefix)


def test_each_glob_is_compiled_once_whatever_the_number_of_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34: ``--only`` globs were compiled again for every cell id (quadratic)."""
    compiled: list[int] = []
    real = selector_module.re.compile

    def counting(pattern: str, *args: Any) -> Any:
        compiled.append(1)
        return real(pattern, *args)

    monkeypatch.setattr(selector_module.re, "compile", counting)
    chosen = Selector(("*/a" + "?" * 200 + "*", "cpu/*"), ("*skip*",))
    ids = [f"gpu/v0.{i}.0/h100/m/default/s/baseline" for i in range(2000)]
    assert chosen.unmatched_only(ids) == ("*/a" + "?" * 200 + "*", "cpu/*")
    assert not any(chosen.matches(i) for i in ids)
    assert len(compiled) <= 4
