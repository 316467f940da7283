"""Dumps hard-wrapped onto lines of their own: which lines are their pieces, joined whole."""

from __future__ import annotations

from repromatrix.triage.dumps import is_dump_piece, join_dumps
from repromatrix.triage.logmodel import parse_line

HEAD = "(APIServer pid=1) INFO 08-14 21:39:48 [utils.py:326] "


def test_a_piece_has_no_prefix_and_holds_items():
    assert is_dump_piece(parse_line(1, "trust_remote_code': True, 'max_model_len': 8"))
    assert not is_dump_piece(parse_line(1, HEAD + "trust_remote_code': True, 'x': 1"))
    assert not is_dump_piece(parse_line(1, "plain words"))
    assert not is_dump_piece(parse_line(1, '  File "/x.py", line 3, in f'))


def test_join_dumps_joins_a_dump_cut_inside_its_marker():
    lines = [HEAD + "non-default ar", "gs: {'model': '/m', 'max_model_len': 8}", HEAD + "next"]
    assert list(join_dumps(lines)) == [
        HEAD + "non-default args: {'model': '/m', 'max_model_len': 8}",
        HEAD + "next",
    ]


def test_join_dumps_takes_an_itemless_tail_only_after_pieces_cut_at_one_width():
    first = HEAD + "non-default args: {'model': '/m', 'enforce_eager':"
    piece = " True, 'trust_remote_code': True, 'max_model_len': 4096, 'x':"
    piece = piece.ljust(len(first))  # cut at the width of the first line
    assert list(join_dumps([first, piece, "True}"])) == [first + piece + "True}"]
    # Not cut at one width: the bare line after the piece is a line of its own.
    assert list(join_dumps([first, piece.strip(), "True}"])) == [first + piece.strip(), "True}"]


def test_join_dumps_leaves_a_dump_of_its_own_and_other_lines_alone():
    lines = [
        "[launcher] starting vllm serve /m",
        "[launcher] vllm: non-default args: {'model': '/m'}",
        "[launcher] vllm: args: Namespace(model='/m', port=8000)",
        "a, b",
    ]
    assert list(join_dumps(lines)) == [*lines[:2], lines[2] + "a, b"]
    assert list(join_dumps(["x=1, y=2", "z=3, w=4"])) == ["x=1, y=2", "z=3, w=4"]
