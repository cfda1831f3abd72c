"""``vit-attention`` command line: thin sub-commands over the library.

Each part of the package that offers commands exposes ``add_commands(subparsers)``; this file
only collects them. With no sub-command it runs the main job (``train`` on the embedded data
set when the training commands are installed, else ``summary``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from . import __version__

# Modules that contribute sub-commands, in help order. Each defines add_commands(subparsers).
_COMMAND_MODULES = (
    "vit_attention.registry_commands",
    "vit_attention.train.commands",
    "vit_attention.analysis.commands",
    "vit_attention.analysis.generate",
    "vit_attention.bench.commands",
    "vit_attention.export.commands",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="vit-attention",
        description="Vision-transformer attention mechanisms and backbones: build, inspect, train, compare.",
    )
    parser.add_argument("--version", action="version", version=f"vit-attention {__version__}",
                        help="print the package version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise  # a real missing dependency inside the module, not an absent part
            continue
        module.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vit-attention`` script; returns the exit code.

    As a ``torchrun`` rank's program (``argv`` from the command line, ``WORLD_SIZE`` > 1) it ends the process
    itself once the command is done: see :func:`_end_torchrun_rank`.
    """
    code = _main(argv)
    if argv is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _end_torchrun_rank(code)
    return code


def _end_torchrun_rank(code: int) -> None:
    """Flush and end this ``torchrun`` rank with ``code``, skipping the interpreter's finalization.

    Gloo's worker threads (CPU runs) outlive ``destroy_process_group`` while FSDP2 / DTensor caches still
    hold the group, and a worker may release a finished collective's tensors a moment after the main thread
    saw it complete. Releasing a tensor whose Python object was already dropped takes the GIL; on CPython
    3.11 a thread that takes the GIL while the interpreter finalizes is ended with ``pthread_exit``, whose
    forced unwind through Gloo's ``noexcept`` loop aborts the process ("terminate called without an active
    exception", SIGABRT) after a run that succeeded. Every file of the run is written and closed before
    the command returns, so nothing is lost by ending here.
    """
    import logging

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be written to it
            pass
    logging.shutdown()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` when ``None``), run the sub-command and return its exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        # no sub-command: the main job's, with any options given (`vit-attention --epochs 1` trains 1 epoch)
        default = "train" if "train" in parser._subparsers._group_actions[0].choices else "summary"  # type: ignore
        argv = [default, *argv]
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():  # Python warnings on the command line: one plain line each
            warnings.showwarning = _plain_warning
            return int(args.func(args) or 0)
    except BrokenPipeError:  # `vit-attention models | head`: the reader left; not an error of ours
        _silence_stdout()
        return 0
    except Exception as e:  # what a user can cause becomes one line (MemoryError too); anything else re-raised
        msg = user_error_message(e)
        if msg is None:
            raise
        print(f"vit-attention {args.command}: error: {msg}", file=sys.stderr)
        return 2


def user_error_message(e: BaseException) -> str | None:
    """The one-line message of an error a user can cause (bad input, unreadable or unsafe files, a full disk,
    too little memory), saying what to do; ``None`` for anything else (a bug: the traceback is kept)."""
    import pickle

    from safetensors import SafetensorError

    from .train.errors import TrainingOutOfMemory, disk_full, out_of_memory

    if isinstance(e, KeyError):
        return str(e.args[0]) if e.args else "missing key"
    if isinstance(e, OSError) and disk_full(e) and "disk is full" not in str(e):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}the disk is full ({e.strerror}); free some space and run again"
    if isinstance(e, (ValueError, OSError, TypeError, pickle.UnpicklingError)):  # incl. UnsafeCheckpointError
        return str(e)
    if isinstance(e, SafetensorError):
        if disk_full(e):
            return f"the disk is full while writing a safetensors file ({e}); free some space and run again"
        return f"cannot read or write a safetensors file: {e} (is the file whole? a .safetensors file must be one)"
    if isinstance(e, TrainingOutOfMemory):  # its message already names the options and the resume
        return str(e)
    if out_of_memory(e):
        detail = re.sub(r"^\[enforce fail at [^]]*\] ?", "", (str(e).strip().splitlines() or [""])[0])
        return (f"out of memory{f' ({detail})' if detail else ''}: use a smaller --batch-size, a smaller "
                "--img-size or a smaller model, or run on a machine with more memory")
    return None


def _plain_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the command line: ``warning: MESSAGE`` on stderr, one line, without the
    Python file, line number and source line (a skipped corrupt image is one plain line per file)."""
    print(f"warning: {message}", file=file or sys.stderr, flush=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in tests)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
