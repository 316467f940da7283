"""Hostile input to ``publish``: ids that would become paths, a tampered history, a previous
site full of links, two publishes at once, a file in the way of ``--out``.

The classes (each a parametrized test): run ids read from results that would
leave the site or break its paths; history points whose page is not a page of
the site (script and outside URLs, paths out of the site); history fields of
the wrong type or outside their grammar; links and special files in the
previous site; and the command's own arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from repromatrix.cli import main
from repromatrix.errors import EXIT_OK, EXIT_USAGE
from repromatrix.files import LeadsOut, hold
from repromatrix.publish.site import publish_staged
from repromatrix.reports.findings import ReportOptions
from repromatrix.results.store import cell_dir
from support import paths
from support.reports import cpu_lane, write_run

SCENARIOS = str(paths.SCENARIOS)
RUN = "20260101-000000"
VICTIM = "cpu/0.32.0/cpu/tiny-llama/default/healthy-cpu/baseline"
GOOD = 5


def publish(*args: str) -> int:
    return main(["publish", *args, "--scenarios", SCENARIOS])


def tree(root: Path) -> set[Path]:
    """Every path below ``root`` (links not followed)."""
    found: set[Path] = set()
    for here, dirs, files in os.walk(root):
        found |= {Path(here, name) for name in dirs + files}
    return found


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / RUN
    write_run(folder, cpu_lane())
    return folder


def edit_victim(run_dir: Path, **changes: Any) -> None:
    path = cell_dir(run_dir, VICTIM) / "result.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


# --- run ids read from results --------------------------------------------------------------

HOSTILE_RUN_IDS = [
    "../../../x",  # the example: pages outside --out
    "../../../../../../tmp/owned",
    "/tmp/owned",
    "a/../../b",
    "..",
    ".hidden",
    "a\x00b",  # a NUL: a traceback when it became a path
    "r" * 300,  # longer than a file name may be
    "run\nid",
    "-rf",
    "run id",
    "run?id#x",
    "javascript:alert(1)",
    "\u202erun",
]


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=range(len(HOSTILE_RUN_IDS)))
def test_a_run_id_read_from_a_result_never_becomes_a_path(
    run_dir: Path, tmp_path: Path, run_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_victim(run_dir, run_id=run_id)
    before = tree(tmp_path)
    out = tmp_path / "site"
    assert publish(str(run_dir), "--out", str(out)) == EXIT_OK
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"problem: {run_dir}/cells/{VICTIM}/result.json: " in err  # said, not dropped
    assert "`run_id`" in err
    assert {p for p in tree(tmp_path) - before if out not in p.parents and p != out} == set()
    history = json.loads((out / "history.json").read_text())
    assert [r["id"] for r in history["runs"]] == [RUN]
    assert VICTIM not in history["cells"] and len(history["cells"]) == GOOD


@pytest.mark.parametrize("name", ["run id", "a?b", "x" * 100, "-x"])
def test_a_results_folder_named_outside_the_run_id_grammar_is_refused_when_it_names_the_run(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / name
    write_run(folder, cpu_lane())
    for path in folder.rglob("result.json"):
        path.write_text(json.dumps(json.loads(path.read_text()) | {"run_id": ""}))
    assert publish(str(folder), "--out", str(tmp_path / "site")) == EXIT_USAGE
    assert "not a run id" in capsys.readouterr().err
    assert not (tmp_path / "site" / "cells").exists()


# --- a tampered history ---------------------------------------------------------------------

SCRIPT_PAGES = [
    "javascript:alert(document.cookie)",  # the example
    "JavaScript:alert(1)",
    " javascript:alert(1)",
    "java\tscript:alert(1)",
    "javascript&#58;alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "https://evil.example/phish.html",
    "//evil.example/phish.html",
    "/etc/passwd",
    "../../../etc/passwd.html",
    "cells/../../outside.html",
    "cells/x.html?javascript:1",
    'cells/x.html#"><script>alert(1)</script>',
    "file:///etc/passwd",
    "\\\\evil\\share.html",
]


@pytest.fixture
def site(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "site"
    assert publish(str(run_dir), "--out", str(out)) == EXIT_OK
    return out


def tamper(site: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = site / "history.json"
    history = json.loads(path.read_text())
    change(history)
    path.write_text(json.dumps(history))


def _first_point(history: dict[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = history["cells"][VICTIM][0]
    return point


@pytest.mark.parametrize("page", SCRIPT_PAGES, ids=range(len(SCRIPT_PAGES)))
def test_a_history_page_that_is_not_a_page_of_the_site_is_refused_when_read(
    site: Path, run_dir: Path, page: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tamper(site, lambda h: _first_point(h).update(page=page))
    index_before = (site / "index.html").read_bytes()
    assert publish(str(run_dir), "--out", str(site)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "`page`" in err and "not a page of the site" in err and "Traceback" not in err
    assert (site / "index.html").read_bytes() == index_before


def _set(*where: str | int, value: object) -> Callable[[dict[str, Any]], None]:
    def change(history: dict[str, Any]) -> None:
        node: Any = history
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value

    return change


def _rename_cell(new: str) -> Callable[[dict[str, Any]], None]:
    def change(history: dict[str, Any]) -> None:
        history["cells"][new] = history["cells"].pop(VICTIM)

    return change


BAD_FIELDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "run date a number": _set("runs", 0, "date", value=5),  # the issue's: crashed sorting
    "run date null": _set("runs", 0, "date", value=None),
    "run id a list": _set("runs", 0, "id", value=["x"]),
    "run id climbs out": _set("runs", 0, "id", value="../../x"),
    "run cells text": _set("runs", 0, "cells", value="6"),
    "run cells true": _set("runs", 0, "cells", value=True),
    "run title an object": _set("runs", 0, "title", value={}),
    "runs an object": _set("runs", value={}),
    "cells a list": _set("cells", value=[]),
    "points an object": _set("cells", VICTIM, value={}),
    "a point a list": _set("cells", VICTIM, 0, value=[]),
    "point date a number": _set("cells", VICTIM, 0, "date", value=1),
    "point run climbs out": _set("cells", VICTIM, 0, "run", value="../../x"),
    "point outcome unknown": _set("cells", VICTIM, 0, "outcome", value="exploded"),
    "point verdict null": _set("cells", VICTIM, 0, "verdict", value=None),
    "point digest a number": _set("cells", VICTIM, 0, "digest", value=7),
    "point cause a list": _set("cells", VICTIM, 0, "cause", value=[]),
    "point with an extra field": _set("cells", VICTIM, 0, "extra", value=1),
    "cell id climbs out": _rename_cell("cpu/a/b/c/d/../../../../x"),
    "cell id a scenario path": _rename_cell("cpu/0.32.0/cpu/m/default/../../../../x/baseline"),
    "cell id upper case": _rename_cell(VICTIM.upper()),
    "schema_version text": _set("schema_version", value="1"),
    "a list": lambda h: h.clear(),
    "run cells of 4001 digits": _set("runs", 0, "cells", value=10**4000),  # issue 34, item 7
}


@pytest.mark.parametrize("name", list(BAD_FIELDS))
def test_a_history_field_of_the_wrong_type_or_grammar_is_one_line(
    site: Path, run_dir: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tamper(site, BAD_FIELDS[name])
    before = tree(tmp_path)
    assert publish(str(run_dir), "--out", str(site)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not a history this repromatrix can extend" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert tree(tmp_path) == before


def test_a_history_that_is_a_link_or_a_fifo_is_refused_without_reading_it(
    site: Path, run_dir: Path, tmp_path: Path
) -> None:
    history = site / "history.json"
    (tmp_path / "elsewhere.json").write_bytes(history.read_bytes())
    history.unlink()
    history.symlink_to(tmp_path / "elsewhere.json")
    assert publish(str(run_dir), "--out", str(site)) == EXIT_USAGE
    history.unlink()
    os.mkfifo(history)  # reading it would wait for ever
    assert publish(str(run_dir), "--out", str(site)) == EXIT_USAGE


# --- a previous site full of links ----------------------------------------------------------

PLANTED = {
    "a link to a file": lambda site, out: (site / "passwd.html").symlink_to("/etc/passwd"),
    "a link to a folder": lambda site, out: (site / "etc").symlink_to("/etc"),
    "a relative link": lambda site, out: (site / "up.html").symlink_to("../secret.txt"),
    "a link inside a folder": lambda site, out: (site / "cells" / "x.html").symlink_to(
        "/etc/hostname"
    ),
    "a FIFO": lambda site, out: os.mkfifo(site / "pipe.html"),
    "a link to a folder beside the pages": lambda site, out: (site / "scenarios.bak").symlink_to(
        "/etc", target_is_directory=True
    ),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_previous_copies_no_link_and_says_so(
    site: Path, run_dir: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    PLANTED[name](site, tmp_path)
    out = tmp_path / "fresh"
    capsys.readouterr()
    assert publish(str(run_dir), "--out", str(out), "--previous", str(site)) == EXIT_OK
    err = capsys.readouterr().err
    assert "not copied" in err
    links = [p for p in tree(out) if p.is_symlink()]
    assert links == []
    assert all(p.is_file() or p.is_dir() for p in tree(out))
    assert "secret" not in " ".join(p.read_text() for p in tree(out) if p.suffix == ".html")
    assert sum(1 for _ in tree(out)) < 200  # not /etc copied in


def test_a_previous_site_whose_history_is_a_link_is_not_a_site(
    site: Path, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = site / "history.json"
    (tmp_path / "h.json").write_bytes(history.read_bytes())
    history.unlink()
    history.symlink_to(tmp_path / "h.json")
    out = tmp_path / "fresh"
    assert publish(str(run_dir), "--out", str(out), "--previous", str(site)) == EXIT_USAGE
    assert "not a published site" in capsys.readouterr().err


# --- the command's own arguments and two publishes at once ----------------------------------


def test_an_out_that_is_a_file_is_one_line_exit_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "site"
    out.write_text("a file")
    for where in (out, out / "below"):
        assert publish(str(run_dir), "--out", str(where)) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "a file, not a folder" in err and len(err.strip().splitlines()) == 1


def test_a_second_publish_into_a_site_being_published_is_refused(
    site: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = (site / "history.json").read_bytes()
    with hold(site, "publish"):  # what a publish holds while it writes
        assert publish(str(run_dir), "--out", str(site)) == EXIT_USAGE
    assert "being written by another publish" in capsys.readouterr().err
    assert (site / "history.json").read_bytes() == history
    assert publish(str(run_dir), "--out", str(site)) == EXIT_OK  # free again


def test_unreadable_results_are_named_not_dropped(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cell_dir(run_dir, VICTIM) / "result.json").write_text("{")
    assert publish(str(run_dir), "--out", str(tmp_path / "site")) == EXIT_OK
    err = capsys.readouterr().err
    assert f"problem: {run_dir}/cells/{VICTIM}/result.json: not valid JSON" in err


def test_problems_are_said_with_their_escapes_made_visible(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = {"problems": [{"kind": "conflict", "where": "x", "message": "\x1b]0;owned\x07"}]}
    (run_dir / "merge.json").write_text(json.dumps(record))
    assert publish(str(run_dir), "--out", str(tmp_path / "site")) == EXIT_OK
    err = capsys.readouterr().err
    assert "\\x1b]0;owned\\x07" in err and "\x1b" not in err


@pytest.mark.parametrize("key", ["../outside.txt", "a/../../outside.txt", "<absolute>"])
def test_a_page_whose_key_leads_out_of_the_site_is_refused(
    run_dir: Path, tmp_path: Path, key: str
) -> None:
    """Issue 34: publish writes only below its own folder, whatever a key says."""
    out = tmp_path / "site"
    key = str(tmp_path / "outside.txt") if key == "<absolute>" else key
    with pytest.raises(LeadsOut):
        publish_staged([run_dir], out, ReportOptions(), lambda _h, _s: {key: b"x"})
    assert not (tmp_path / "outside.txt").exists()
    assert not out.exists()  # the site is as it was: none
