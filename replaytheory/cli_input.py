"""Command-line input shared by the ``replaytheory`` and ``llm_experiments`` commands.

A bad argument or input file ends as one line on stderr, ``PROG: error: MESSAGE``, naming the
flag (or file) and what is allowed, with exit status 2 (argparse's convention), never a
traceback: ``Parser`` prints argparse's own errors that way and ``Parser.report`` any
``ValueError``; the argument types below check a number's range or a path's kind where the
flag is declared; the readers turn an unreadable or malformed file into a ``BadInput`` that
names the flag and the path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import Callable

from . import checks
from .io import open_text


class BadInput(ValueError):
    """A bad command-line input; the message names the flag or file and what is allowed."""


def one_line(text: str) -> str:
    """``text`` with its lines joined by single spaces (an error message spans no lines)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``PROG: error: MESSAGE``, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")

    def report(self, exc: Exception) -> int:
        """Print ``exc`` as this command's one-line error; returns the exit status 2."""
        print(f"{self.prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2

    @classmethod
    def from_doc(cls, prog: str, doc: str) -> "Parser":
        """A parser whose help shows a module docstring ``doc`` once: its first paragraph,
        whole (not its first line, which may end mid-sentence), as the description, and the
        other paragraphs as they are written (lists, commands) after the options."""
        first, _, rest = doc.strip().partition("\n\n")
        return cls(prog=prog, description=textwrap.fill(one_line(first), 79),
                   epilog=rest.strip() or None,
                   formatter_class=argparse.RawDescriptionHelpFormatter)


def _argument_type(check: Callable, convert: Callable, name: str) -> Callable[[str], object]:
    """An argparse ``type``: ``convert(text)`` checked by ``check("value", v)``; a failure
    becomes argparse's "argument --flag: must be ..., got ..." error."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = text  # the check then names the range and the text received
        try:
            return check("value", value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value ")) from None
    parse.__name__ = name
    return parse


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in [lo, hi] (None = unbounded)."""
    return _argument_type(lambda name, v: checks.integer(name, v, lo, hi), int, "integer")


def real(lo: float = -float("inf"), hi: float = float("inf"), *,
         lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite real number in [lo, hi] ((lo, hi] with lo_open)."""
    return _argument_type(lambda name, v: checks.real(name, v, lo, hi, lo_open=lo_open),
                          float, "real")


def _existing(text: str, folder: bool) -> str:
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if not (os.path.isdir(text) if folder else os.path.isfile(text)):
        raise argparse.ArgumentTypeError(f"{text!r} is a {other}, not a {kind}"
                                         if os.path.exists(text) else f"no such {kind} {text!r}")
    return text


def existing_file(text: str) -> str:
    """An argparse ``type`` for a path that must be an existing file."""
    return _existing(text, folder=False)


def existing_dir(text: str) -> str:
    """An argparse ``type`` for a path that must be an existing folder."""
    return _existing(text, folder=True)


def _blocking_file(path: str) -> str:
    """The nearest existing ancestor of ``path`` if it is a file (no folder can be made
    there), else ''."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return "" if os.path.isdir(parent) else parent


def output_dir(text: str) -> str:
    """An argparse ``type`` for an output folder: absent (it is made) or a folder."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder")
    blocked = _blocking_file(text)
    if blocked:
        raise argparse.ArgumentTypeError(f"{text!r} lies under the file {blocked!r}")
    return text


def output_file(text: str) -> str:
    """An argparse ``type`` for a file to write: not a folder, its folder makeable."""
    if os.path.isdir(text) or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    blocked = _blocking_file(text)
    if blocked:
        raise argparse.ArgumentTypeError(f"{text!r} lies under the file {blocked!r}")
    return text


def file_label(path: str, flag: str = "") -> str:
    """How a message names an input file: its flag (or "file") and its path."""
    return f"{flag or 'file'} {os.fspath(path)!r}"


def read_text(path: str, flag: str = "") -> str:
    """The text of the file ``path`` (gzip-decompressed when its name ends in ``.gz``);
    ``BadInput`` naming ``flag`` and ``path`` if it is missing, a folder, not gzip or not
    UTF-8."""
    try:
        with open_text(os.fspath(path)) as fh:
            return fh.read()
    except FileNotFoundError:
        raise BadInput(f"{file_label(path, flag)}: no such file") from None
    except UnicodeDecodeError:
        raise BadInput(f"{file_label(path, flag)}: not UTF-8 text") from None
    except (OSError, EOFError) as exc:  # a folder, no permission, a torn or false .gz
        why = getattr(exc, "strerror", None) or one_line(exc) or type(exc).__name__
        raise BadInput(f"{file_label(path, flag)}: cannot read it ({why})") from None


def kind_name(kind: type) -> str:
    """"an object", "a list" or the type's name, for "holds X, not Y" messages."""
    return {dict: "an object", list: "a list"}.get(kind, kind.__name__)


def parse_json(text: str, path: str, flag: str = "", kind: type | None = dict):
    """``text`` (of ``path``) parsed as JSON, of type ``kind`` (None = any); ``BadInput``
    naming ``flag``, ``path`` and where the JSON breaks otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{file_label(path, flag)}: not JSON ({exc.msg} at line {exc.lineno} "
                       f"column {exc.colno})") from None
    except RecursionError:
        raise BadInput(f"{file_label(path, flag)}: not JSON (nested too deeply)") from None
    if kind is not None and not isinstance(value, kind):
        raise BadInput(f"{file_label(path, flag)}: holds {kind_name(type(value))}, not "
                       f"{kind_name(kind)}")
    return value


def read_json(path: str, flag: str = "", kind: type | None = dict):
    """The JSON file ``path`` (``read_text``, ``parse_json``): a ``kind`` or ``BadInput``."""
    return parse_json(read_text(path, flag), path, flag, kind)


def read_jsonl(path: str, flag: str = "", skip_torn: bool = False) -> list[dict]:
    """The JSON objects of the JSON-lines file ``path`` (``.gz``: gzip), blank lines skipped.
    ``BadInput`` names ``flag``, ``path`` and the line of a line that is no JSON object;
    ``skip_torn`` skips undecodable lines instead (a log whose writer was killed mid-line and
    resumed)."""
    rows = []
    for number, line in enumerate(read_text(path, flag).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            if skip_torn:
                continue
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise BadInput(f"{file_label(path, flag)}: line {number} is not JSON ({why})") from None
        if not isinstance(row, dict):
            raise BadInput(f"{file_label(path, flag)}: line {number} holds "
                           f"{kind_name(type(row))}, not an object")
        rows.append(row)
    return rows


def missing_field(exc: KeyError, path: str, flag: str = "", expected: str = "") -> BadInput:
    """A ``BadInput`` for a field ``exc`` that the file ``path`` lacks."""
    return BadInput(f"{file_label(path, flag)}: no field {exc.args[0]!r}"
                    + (f"; expected {expected}" if expected else ""))
