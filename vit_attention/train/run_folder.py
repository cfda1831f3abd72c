"""Run folders: a new ``runs/<model>-<time>`` created exclusively (``-1``, ``-2``, ... on collision),
the checks that an ``--output`` folder can be created and written (``ValueError`` naming ``--output``),
and :class:`RunLock`, which makes one process the only writer of a run folder for the run's life.

The lock is an OS advisory lock (``fcntl.flock``; ``msvcrt.locking`` on Windows) on the file
:data:`LOCK_NAME` inside the folder, so a process that dies, even by ``SIGKILL``, releases it with
its file descriptors; a second run on the same folder is refused with :class:`RunFolderBusy`.
Where neither exists the file is created exclusively and holds the owner's process id, and a
lock whose process is gone is taken over.
"""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

__all__ = ["create_run_folder", "check_output_folder", "check_new_run_folder", "claim_run_folder", "RunLock",
           "RunFolderBusy", "LOCK_NAME", "RUN_FILES"]

LOCK_NAME = ".run.lock"
# Every file a training run writes in its folder: a folder holding any of them is refused unless resumed.
RUN_FILES = ("checkpoint.safetensors", "checkpoint.json", "metrics.csv", "metrics.json", "model.safetensors",
             "model_ema.safetensors", "curves.png", "config.json")
# Temporary files of atomic_write (``.<name>.<12 hex>.tmp``): left only by a process killed while writing.
_TEMP = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]


class RunFolderBusy(ValueError):
    """Another process holds the run folder's lock (it is training in it right now)."""


def create_run_folder(model: str, root: str | Path = "runs") -> Path:
    """Create and return a new run folder ``root/<model>-<time>`` (``-1``, ``-2``, ... when taken).

    The folder is created exclusively (``mkdir`` without ``exist_ok``), so concurrent runs started
    in the same second each get their own. Raises ``ValueError`` naming ``--output`` when ``root``
    cannot be created or written.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the run folder {root}/ ({e.strerror or e}); choose a writable "
                         "folder with --output") from None
    for i in range(10_000):
        out = root / (f"{model}-{stamp}" + (f"-{i}" if i else ""))
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
        except OSError as e:
            raise ValueError(f"cannot create the run folder {out} ({e.strerror or e}); choose a writable "
                             "folder with --output") from None
    raise ValueError(f"no free run folder name for {root}/{model}-{stamp}; choose one with --output")


def check_output_folder(output: str | Path) -> None:
    """Raise ``ValueError`` naming ``--output`` when ``output`` cannot become a writable run folder.

    Creates nothing: the nearest existing ancestor must be a folder the process may write in.
    """
    path = Path(output)
    try:
        if path.exists() and not path.is_dir():
            raise ValueError(f"--output {output} is a file; expected a folder for the run")
        probe = path
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise ValueError(f"--output {output}: {probe} is a file, so the run folder cannot be created there")
        if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
            raise ValueError(f"--output {output}: {probe} is not writable; choose a folder you may write in")
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, ...
        if isinstance(e, ValueError) and str(e).startswith("--output"):
            raise
        raise ValueError(f"--output {output!r} is not a usable folder name ({e}); expected a writable "
                         "folder path") from None


def check_new_run_folder(folder: str | Path) -> None:
    """Raise ``ValueError`` naming ``--output`` when ``folder`` holds any file a run writes (:data:`RUN_FILES`).

    A new run would overwrite them: a finished or interrupted run (continue it with ``--resume``), or
    files of another kind, e.g. a downloaded model's ``config.json`` and ``model.safetensors``.
    """
    folder = Path(folder)
    found = [name for name in RUN_FILES if (folder / name).exists()]
    if not found:
        return
    if "checkpoint.safetensors" in found or "metrics.json" in found:
        raise ValueError(f"output folder {folder} already holds a run; pass --resume to continue it, or choose "
                         "another --output (nothing was overwritten)")
    raise ValueError(f"--output {folder} already holds {', '.join(found)}, which a training run would overwrite "
                     "(it is not a run to --resume); choose a new or empty folder with --output (nothing was "
                     "overwritten)")


def claim_run_folder(folder: str | Path, *, resume: bool = False, new: bool = False) -> RunLock:
    """Create ``folder`` if needed and lock it for this run; returns the held :class:`RunLock`.

    A new run (``resume=False``) is refused (``ValueError``) when the folder holds files a run writes;
    the check runs under the lock, so two runs started together cannot both pass it. ``new``: the
    caller just created the folder (a default ``runs/<model>-<time>``), so a refused or failed start
    removes it. Errors are ``ValueError`` naming ``--output`` (:class:`RunFolderBusy` when in use).
    """
    lock = RunLock(folder, created=True if new else None)
    try:
        lock.acquire()
    except OSError as e:
        raise ValueError(f"--output {folder}: cannot create or write the run folder ({e.strerror or e}); "
                         "expected a writable folder") from None
    try:
        if not resume:
            check_new_run_folder(folder)
    except BaseException:
        lock.release()
        raise
    return lock


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (for the lock file without OS locks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class RunLock:
    """The exclusive right to write in one run folder, held from :meth:`acquire` to :meth:`release`.

    ``RunLock(folder).acquire()`` creates ``folder`` if needed, takes the lock or raises
    :class:`RunFolderBusy` naming ``--output`` and the owner's process id, then removes temporary
    files a killed writer left (no one else can be writing them). :meth:`release` unlocks and
    deletes the lock file; when this lock created the folder and nothing else was written there, the
    folder goes too, so a run refused at start-up leaves no empty folder behind.
    """

    def __init__(self, folder: str | Path, *, created: bool | None = None) -> None:
        """``created``: whether the caller made ``folder`` for this run (``None``: whether :meth:`acquire` makes it)."""
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None
        self._created = bool(created)
        self._auto = created is None

    @property
    def held(self) -> bool:
        """True between a successful :meth:`acquire` and :meth:`release`."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock (non-blocking); ``RunFolderBusy`` if another process holds it. Returns ``self``."""
        if self._auto:
            self._created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            fd = self._try_lock()
            if fd is not None:
                self._fd = fd
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._remove_temporaries()
                return self
            time.sleep(0.01)  # the file was replaced between open and lock: try the new one
        raise RunFolderBusy(f"--output {self.folder}: could not take the run folder's lock {self.path}")

    def _try_lock(self) -> int | None:
        """An fd holding the lock on the current lock file, ``None`` to retry; raises when it is held."""
        if fcntl is None and msvcrt is None:  # pragma: no cover - no OS locks: exclusive creation + pid
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                pid = self._owner()
                if pid is not None and _pid_alive(pid):
                    raise self._busy(pid) from None
                self.path.unlink(missing_ok=True)  # its process is gone
                return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:  # pragma: no cover - Windows
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                raise self._busy(self._owner()) from None
            raise
        try:  # a releasing owner may have deleted the file we opened: the lock must be on the named file
            same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return None
        return fd

    def _owner(self) -> int | None:
        """The process id the lock file names, if readable."""
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _busy(self, pid: int | None) -> RunFolderBusy:
        who = f"process {pid}" if pid else "another process"
        return RunFolderBusy(f"--output {self.folder} is in use: {who} is training in it right now (one run writes "
                             "a run folder at a time); wait for it to finish, then --resume it, or choose another "
                             "--output (nothing was changed)")

    def _remove_temporaries(self) -> None:
        """Delete ``.<name>.<hex>.tmp`` files of writes a killed process never finished."""
        for p in self.folder.iterdir():
            if _TEMP.match(p.name) and p.is_file():
                p.unlink(missing_ok=True)

    def release(self) -> None:
        """Delete the lock file and unlock (the folder too, when this lock made it and it holds nothing else)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # before unlocking: a process that opened it re-checks the name
        except OSError:  # pragma: no cover - Windows cannot delete an open file; the next owner reuses it
            pass
        os.close(fd)  # closing releases flock / msvcrt locks
        if self._created:
            try:
                self.folder.rmdir()  # only when empty: a run that wrote nothing leaves no folder
            except OSError:
                pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
