"""Atomic writes: a reader sees a file's (or a directory's) old content or its new one, never a part.

`atomic_path(path)` yields a temporary name beside `path` (same extension, hidden by TMP_PREFIX);
on a clean exit the file is fsynced and renamed over `path` (os.replace), then the directory is
fsynced; on an error the temporary file is removed (`temp_file`: the same, without the rename).
`atomic_write` and `write_json` open and fill it. `staged_directory(path, overwrite)` yields a new directory beside `path` that takes its place
whole on a clean exit (an existing `path` is swapped out only with overwrite=True).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile

TMP_PREFIX = ".tmp-"


def fsync_path(path: str) -> None:
    """Flush a file's or a directory's contents (a directory: its entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mode(full: int = 0o666) -> int:
    """`full` less the umask: the permissions open() (0o666) or mkdir (0o777) give, where mkstemp
    and mkdtemp give 0o600 / 0o700."""
    umask = os.umask(0)
    os.umask(umask)
    return full & ~umask


@contextlib.contextmanager
def temp_file(path: str | os.PathLike):
    """Yields a new temporary file name beside `path` (TMP_PREFIX, path's extension: np.savez and
    savefig read it) to write whole; fsynced on a clean exit and left for the caller to rename,
    removed on an error."""
    path = os.path.abspath(os.fspath(path))
    directory, base = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{TMP_PREFIX}{base}.",
                               suffix=os.path.splitext(base)[1])
    os.close(fd)
    try:
        os.chmod(tmp, _mode())
        yield tmp
        fsync_path(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary file name (temp_file) that replaces `path` on a clean exit."""
    path = os.path.abspath(os.fspath(path))
    with temp_file(path) as tmp:
        yield tmp
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_path(os.path.dirname(path))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_kw):
    """open() of a temporary file that replaces `path` on a clean exit (atomic_path)."""
    with atomic_path(path) as tmp, open(tmp, mode, **open_kw) as f:
        yield f


def write_json(path: str | os.PathLike, obj, **dump_kw) -> None:
    """json.dump(obj) to `path` atomically, with a final newline; dump_kw as json.dump's."""
    with atomic_write(path) as f:
        json.dump(obj, f, **dump_kw)
        f.write("\n")


def _fsync_tree(root: str) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)


_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def is_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.listdir(path)


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike, *, overwrite: bool = False, what: str = "directory"):
    """Yields a new empty directory beside `path` to fill; on a clean exit it is fsynced and takes
    path's place in one rename (or one exchange, for an existing `path`, whose old tree is then
    removed). FileExistsError naming `path` when it exists (and is not an empty directory) unless
    overwrite=True, before anything is written. `what` names the content in that message. The
    temporary trees of an earlier save into `path` that was killed are removed first."""
    path = os.path.abspath(os.fspath(path))
    exists = os.path.lexists(path) and not is_empty_dir(path)
    if exists and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace the {what} "
                              "there whole")
    if exists and not os.path.isdir(path):
        raise FileExistsError(f"{path} exists and is not a directory; refusing to replace it")
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):          # the trees of a save into `path` killed midway
        if name.startswith(f"{TMP_PREFIX}{base}.") and os.path.isdir(os.path.join(parent, name)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{base}.")
    trash = tmp                              # after an exchange: the old tree
    try:
        os.chmod(tmp, _mode(0o777))
        yield tmp
        _fsync_tree(tmp)
        if not exists:
            os.replace(tmp, path)            # also over an empty directory
        elif not _exchange(tmp, path):       # no exchange: two renames, `path` missing in between
            trash = tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{base}.old.")
            os.replace(path, trash)
            os.replace(tmp, path)
        fsync_path(parent)
    finally:
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
