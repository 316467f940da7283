"""Hostile output folders: every writer replaces a planted link instead of writing through it,
refuses a folder on its way that leads elsewhere, and gives its files the mode the umask says.

The classes (each a parametrized test, every writer of the command line in each):
a link planted where a file goes (absolute, relative, dangling), a link planted
where a folder goes, a run folder that is a link, and the mode of what is written.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from repromatrix.cli import main
from repromatrix.errors import EXIT_OK, EXIT_USAGE, UsageError
from repromatrix.files import LeadsOut, copy_tree, folder_inside, hold, inside, replace_file
from repromatrix.run.folder import RunFolder, resolve_folder
from support import paths
from support.reports import cpu_lane, write_run

SCENARIOS = str(paths.SCENARIOS)
KEEP = "keep me: outside the output folder"


def render(out: Path) -> int:
    only = ["--lane", "cpu", "--only", "cpu/0.32.0/*", "--scenarios", SCENARIOS]
    return main(["render", "--out", str(out), *only])


def schema(out: Path) -> int:
    return main(["schema", "--out", str(out)])


def report(out: Path) -> int:
    if not (out / "cells").exists():
        write_run(out, cpu_lane())
    return main(["report", str(out), "--scenarios", SCENARIOS])


def publish(out: Path) -> int:
    results = out.parent / "results" / "20260101-000000"
    if not results.exists():
        write_run(results, cpu_lane())
    return main(["publish", str(results), "--out", str(out), "--scenarios", SCENARIOS])


@dataclass(frozen=True)
class Writer:
    """A command that writes into a folder, and a file and a folder it writes there."""

    write: Callable[[Path], int]
    file: str
    folder: str


WRITERS = {
    "render": Writer(render, "cpu-0.32.0/Dockerfile", "cpu-0.32.0/harness"),
    "schema": Writer(schema, "matrix.schema.json", ""),
    "report": Writer(report, "compat.html", ""),
    "publish": Writer(publish, "index.html", "scenarios"),
}


def plant_absolute(link: Path, target: Path) -> None:
    link.symlink_to(target)


def plant_relative(link: Path, target: Path) -> None:
    link.symlink_to(os.path.relpath(target, link.parent))


def plant_dangling(link: Path, target: Path) -> None:
    target.unlink()  # writing through the link would create the file outside
    link.symlink_to(target)


PLANTS = {"absolute": plant_absolute, "relative": plant_relative, "dangling": plant_dangling}


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_link_planted_where_a_file_goes_is_replaced_not_followed(
    tmp_path: Path, name: str, plant: str
) -> None:
    writer = WRITERS[name]
    out = tmp_path / "out"
    assert writer.write(out) == EXIT_OK  # once, so every folder of the output exists
    victim = tmp_path / "victim.txt"
    victim.write_text(KEEP)
    victim.chmod(0o600)
    link = out / writer.file
    link.unlink()
    PLANTS[plant](link, victim)
    assert writer.write(out) == EXIT_OK
    assert not link.is_symlink() and link.stat().st_size > 0
    if plant == "dangling":
        assert not victim.exists()
    else:
        assert victim.read_text() == KEEP
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", [n for n, w in WRITERS.items() if w.folder])
def test_a_link_planted_where_a_folder_goes_is_never_written_through(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = WRITERS[name]
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    assert writer.write(out) == EXIT_OK
    elsewhere.mkdir()
    folder = out / writer.folder
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
    folder.symlink_to(elsewhere, target_is_directory=True)
    capsys.readouterr()
    code = writer.write(out)
    if name == "render":  # a build context holds exactly its files: a stray link is removed
        assert code == EXIT_OK and not folder.is_symlink()
    else:
        assert code == EXIT_USAGE and "leads out of" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(
    ("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"]
)
@pytest.mark.parametrize("name", list(WRITERS))
def test_what_a_writer_writes_has_the_mode_the_umask_gives(
    tmp_path: Path, name: str, mask: int, mode: int
) -> None:
    writer = WRITERS[name]
    out = tmp_path / "out"
    with umask(mask):
        assert writer.write(out) == EXIT_OK
    modes = {
        p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in out.rglob("*")
        if p.is_file()
    }
    if name == "render":  # a build context is what the image holds: its mode is the image's
        assert set(modes.values()) == {0o644}
    else:
        assert set(modes.values()) == {mode}, modes


# --- a run folder that is a link ------------------------------------------------------------


def test_a_run_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    results, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    results.mkdir()
    elsewhere.mkdir()
    (results / "r1").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UsageError, match="is a symbolic link"):
        resolve_folder(results, "r1", resume=False)
    with pytest.raises(UsageError, match="is a symbolic link"):
        resolve_folder(results, None, resume=True)
    assert list(elsewhere.iterdir()) == []


def test_results_reached_through_a_link_is_resolved_first(tmp_path: Path) -> None:
    real, link = tmp_path / "scratch" / "results", tmp_path / "results"
    real.mkdir(parents=True)
    link.symlink_to(real, target_is_directory=True)
    assert resolve_folder(link, "r1", resume=False) == RunFolder("r1", real / "r1")


def test_the_run_command_refuses_a_linked_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    results.mkdir()
    elsewhere.mkdir()
    (results / "r1").symlink_to(elsewhere, target_is_directory=True)
    argv = ["run", "--dry-run", "--lane", "cpu", "--results", str(results), "--run-id", "r1"]
    assert main([*argv, "--scenarios", SCENARIOS]) == EXIT_USAGE
    assert "is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


# --- the writer itself ----------------------------------------------------------------------


def test_replace_file_keeps_no_temporary_file_and_takes_a_mode(tmp_path: Path) -> None:
    replace_file(tmp_path / "a" / "f", b"x", mode=0o640)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["f"]
    assert stat.S_IMODE((tmp_path / "a" / "f").stat().st_mode) == 0o640


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/x"])
def test_a_path_that_names_its_way_out_is_refused(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    with pytest.raises(LeadsOut):
        inside(root, root / path)
    with pytest.raises(LeadsOut):
        folder_inside(root, root / path)


def test_threads_that_make_one_folder_at_once_all_get_it(tmp_path: Path) -> None:
    # Two image jobs of one run write their environment reports into the same new folder.
    failed: list[BaseException] = []

    def make(root: Path, start: threading.Barrier) -> None:
        start.wait()
        try:
            inside(root, root / "environment" / "report.txt")
        except BaseException as exc:
            failed.append(exc)

    for attempt in range(100):
        root, start = tmp_path / str(attempt), threading.Barrier(4)
        threads = [threading.Thread(target=make, args=(root, start)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert (root / "environment").is_dir()
    assert failed == []


def test_copy_tree_copies_no_link_and_says_so(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "page.html").write_text("page")
    (source / "passwd").symlink_to("/etc/passwd")
    (source / "etc").symlink_to("/etc", target_is_directory=True)
    os.mkfifo(source / "sub" / "fifo")
    left_out = copy_tree(source, target)
    assert sorted(left_out) == [
        "etc: a symbolic link, not copied",
        "passwd: a symbolic link, not copied",
        "sub/fifo: not a regular file, not copied",
    ]
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "sub",
        "sub/page.html",
    ]


def test_a_held_folder_is_refused_to_a_second_writer(tmp_path: Path) -> None:
    first = hold(tmp_path, "publish")
    with first, pytest.raises(UsageError, match="another publish"), hold(tmp_path, "publish"):
        pass
    with hold(tmp_path, "publish"):  # released when the first block ended
        pass


# --- outputs in the way of inputs, and files in the way of outputs --------------------------


@pytest.mark.parametrize("where", ["merged", "cells/merged", "cells/cpu/merged"])
def test_merge_refuses_an_out_inside_a_shard(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = tmp_path / "shard"
    write_run(shard, cpu_lane())
    before = sorted(p.relative_to(shard) for p in shard.rglob("*"))
    assert main(["merge", str(shard), "--out", str(shard / where)]) == EXIT_USAGE
    assert "inside the shard" in capsys.readouterr().err
    assert sorted(p.relative_to(shard) for p in shard.rglob("*")) == before


@pytest.mark.parametrize("command", ["schema", "render", "publish", "merge"])
def test_a_file_given_as_out_is_one_line_exit_2(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = tmp_path / "results" / "20260101-000000"
    write_run(shard, cpu_lane())
    out = tmp_path / "out"
    out.write_text("a file")
    argv = {
        "schema": ["schema", "--out", str(out)],
        "render": ["render", "--out", str(out), "--scenarios", SCENARIOS],
        "publish": ["publish", str(shard), "--out", str(out), "--scenarios", SCENARIOS],
        "merge": ["merge", str(shard), "--out", str(out)],
    }[command]
    capsys.readouterr()
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "a file" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "a file"
