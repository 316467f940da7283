"""Files written the one safe way: whole or not at all, never through a link, inside their folder.

Every output of repromatrix (a run folder, its reports, a site, a build
context, the schemas) is written by ``replace_file``: the bytes go to a new
file created exclusively next to the target, which is then renamed over it. So
a reader sees the old file or the whole new one, a link planted where the file
goes is replaced instead of followed, and the new file gets the mode the
umask gives (a web server can serve a site), unless the caller names one.

``inside`` keeps a write within its output folder: a folder on the way that
is a link to elsewhere (planted, or in a copied site) is refused before any
folder is made through it. ``copy_tree`` copies a folder without following
or copying links. ``hold`` makes one writer of a folder at a time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from repromatrix.errors import UsageError

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LeadsOut(UsageError, ValueError):
    """A write or copy whose path leads out of its folder (through a link, or by name)."""


def replace_file(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one.

    A link at ``path`` is replaced, not followed. The file's mode is ``mode``, or
    what the umask leaves of 0o666 when none is given.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_file(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_file(path: Path) -> tuple[int, Path]:
    """A new, exclusively created file next to ``path`` (the kernel applies the umask)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _NEW_FILE, 0o666), tmp
        except FileExistsError:
            continue


def inside(root: Path, path: Path) -> Path:
    """``path``, once its folder is made inside ``root`` (see ``folder_inside``)."""
    folder_inside(root, path.parent)
    return path


def folder_inside(root: Path, folder: Path) -> Path:
    """``folder``, made inside ``root`` after resolving links (else ``LeadsOut``).

    ``root`` itself is made when missing. Each folder on the way is checked before
    it is made, so a planted link to elsewhere is never written through, not even
    by ``mkdir``.
    """
    root.mkdir(parents=True, exist_ok=True)
    top = root.resolve()
    try:
        relative = folder.relative_to(root)
    except ValueError:
        raise LeadsOut(f"{folder} is not inside {root}") from None
    here = root
    for part in relative.parts:
        here = here / part
        if part == ".." or not here.resolve().is_relative_to(top):
            raise LeadsOut(f"{folder} leads out of {root} (at {here})")
        # exist_ok: another thread of the run may make the same folder at the same moment
        # (two image jobs writing their environment reports); so what is there is checked again.
        here.mkdir(exist_ok=True)
        if not here.resolve().is_relative_to(top):
            raise LeadsOut(f"{folder} leads out of {root} (at {here})")
    return folder


def copy_tree(source: Path, target: Path) -> list[str]:
    """Copy the folders and regular files below ``source`` into ``target``; links are not followed.

    Returns one line for each thing left out (a link, a FIFO, a device), relative
    to ``source``. Files are written with ``replace_file``, so a link in ``target``
    is replaced, and never outside ``target``.
    """
    left_out: list[str] = []
    for folder, dirs, files in os.walk(source, followlinks=False):
        here = Path(folder)
        for name in sorted(dirs + files):
            entry = here / name
            where = entry.relative_to(source).as_posix()
            mode = entry.lstat().st_mode
            if stat.S_ISDIR(mode):
                folder_inside(target, target / where)
            elif not stat.S_ISREG(mode) or not _copy_file(entry, inside(target, target / where)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                left_out.append(f"{where}: {kind}, not copied")
    return left_out


def _copy_file(source: Path, target: Path) -> bool:
    """Copy one regular file; False when it is no longer one (it changed since it was listed)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return False
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return False
        replace_file(target, handle.read())
    return True


@contextmanager
def hold(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder`` for one writer while the block runs; ``UsageError`` when another holds it.

    The lock is a ``flock`` on the folder itself, so no lock file is left in it
    and the kernel drops the lock when its holder dies.
    """
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"{folder} is being written by another {what}; wait for it to end"
            ) from None
        yield
    finally:
        os.close(fd)
