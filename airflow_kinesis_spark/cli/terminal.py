"""The command line's terminal: tables on stdout, progress on stderr, confirmations.

Shared by the commands of ``airflow_kinesis_spark.cli`` (``cli.leftovers`` among them).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["add_columns", "confirm", "console", "printable", "progress", "stdin_is_interactive"]


def console() -> Console:
    """The stdout console, sized to the terminal now (``COLUMNS`` is honoured)."""
    return Console()


@contextmanager
def progress() -> Iterator[Progress]:
    """A progress display on stderr, shown only when stderr is an interactive terminal.

    Nothing of it reaches stdout, so ``--json`` output stays parseable. Rich's ``TTY_INTERACTIVE``
    environment variable (``0``/``1``) overrides the detection.
    """
    stderr = Console(stderr=True)
    display = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=stderr, transient=True, disable=not stderr.is_interactive,
    )  # fmt: skip
    with display:
        yield display


def add_columns(grid: Table, *headers: str, right: tuple[int, ...] = ()) -> None:
    """Columns that stay readable in 80 columns: shard ids are never broken, headers wrap only
    between words, long values (56-digit sequence numbers) fold."""
    for index, header in enumerate(headers):
        grid.add_column(
            header, justify="right" if index in right else "left", no_wrap=header == "shard", overflow="fold",
            min_width=max(len(word) for word in header.split()),
        )  # fmt: skip


def printable(text: str) -> str:
    """``text`` with control characters escaped (ESC as ``\\x1b`` ...): values read from the checkpoint
    table (paths, holders) must not drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def stdin_is_interactive() -> bool:
    """Whether someone can answer a confirmation: stdin is a terminal (tests patch this)."""
    return sys.stdin is not None and sys.stdin.isatty()


def confirm(question: str, *, yes: bool, err: bool, action: str, look_first: str = "with --dry-run") -> None:
    """Ask ``question`` (``[y/N]``) unless ``--yes``; no, or just Enter, aborts (exit status 1).

    :param look_first: how the command shows what it would do without doing it.
    :raises click.UsageError: stdin is not a terminal and ``--yes`` was not given (exit status 2):
        no one is there to answer, and a piped answer is not a confirmation.
    """
    if yes:
        return
    if not stdin_is_interactive():
        raise click.UsageError(
            f"stdin is not a terminal, so {action} cannot ask for confirmation: pass --yes to {action} without "
            f"asking (see what it would do {look_first} first)."
        )
    click.confirm(printable(question), abort=True, err=err)
