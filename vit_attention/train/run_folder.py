"""Run folders: a new ``runs/<model>-<time>`` created exclusively (``-1``, ``-2``, ... on collision),
and the checks that an ``--output`` folder can be created and written (``ValueError`` naming ``--output``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..weights.io import probe_writable

__all__ = ["create_run_folder", "check_output_folder"]


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


def _make_output(path: Path) -> Path:
    """Create ``path`` (and parents) and check a file can be written in it; ``ValueError`` naming --output."""
    try:
        probe_writable(path)
    except OSError as e:
        raise ValueError(f"--output {path}: cannot create or write the run folder ({e.strerror or e}); "
                         "expected a writable folder") from None
    return path
