"""How every `lockgate` command prints its answer: `-o table|json|yaml`, one renderer for all.

Why one module: each command module (cli.py, cli_views.py, and those of other areas) only says
what its answer is (the data, and how it reads as a table); the formats, the column alignment and
the human units (cores, Gi, 3m12s, 25.0%) are the same everywhere.

    from lockgate_adapters.cli_output import Table, render, verbs_of
    render(out, args.output, data, table=lambda: Table(["NAME", "AGE"], [[n, age(t)]]))

`verbs_of(nouns, "jobset", help)` gives a noun's verb subparsers, creating the noun once, so two
modules can add verbs to one noun (`jobset list` here, `jobset cancel` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from lockgate.scheduler import format_amount, format_duration

FORMATS = ("table", "json", "yaml")


def output_parent() -> argparse.ArgumentParser:
    """A parent parser giving a command `-o/--output table|json|yaml`."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-o", "--output", choices=FORMATS, default="table",
                        help="table (default), json or yaml")
    return parent


@dataclass
class Table:
    """Rows of text under a header; `notes` print after it (e.g. hints), `empty` instead of an
    empty table."""

    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    empty: str = ""


# What a command's answer reads as in a table: one Table, or "KEY: value" lines (a mapping).
TableView = Table | Mapping[str, str] | str


def render(out: TextIO, output: str, data: Any,
           *, table: Callable[[], TableView] | None = None) -> None:
    """Print `data` as JSON or YAML, or `table()` (default: `data` as key/value lines)."""
    if dump_structured(out, output, data):
        return
    view: TableView = table() if table is not None else _as_lines(data)
    if isinstance(view, str):
        print(view, file=out)
    elif isinstance(view, Table):
        if not view.rows and view.empty:
            print(view.empty, file=out)
        elif view.rows or view.header:
            print_table(out, view.header, view.rows)
        for note in view.notes:
            print(f"note: {note}", file=out)
    else:
        print_fields(out, view)


def dump_structured(out: TextIO, output: str, data: Any) -> bool:
    """Print `data` as JSON or YAML; False for table output (the caller prints that)."""
    if output == "json":
        json.dump(data, out, indent=2, default=str)
        print(file=out)
        return True
    if output == "yaml":
        yaml.safe_dump(_plain(data), out, sort_keys=False, default_flow_style=False,
                       allow_unicode=True)
        return True
    return False


def print_table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned; a column of numbers (and human amounts) is right-aligned."""
    cells = [[str(cell) for cell in row] for row in [list(header), *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [bool(rows) and all(_looks_numeric(str(row[i])) for row in rows)
               for i in range(len(header))]
    for row in cells:
        parts = [cell.rjust(width) if right else cell.ljust(width)
                 for cell, width, right in zip(row, widths, numeric, strict=True)]
        print("  ".join(parts).rstrip(), file=out)


def print_fields(out: TextIO, fields: Mapping[str, str]) -> None:
    """`Key:   value` lines, the values aligned (as `kubectl describe` prints)."""
    width = max((len(key) for key in fields), default=0) + 1
    for key, value in fields.items():
        print(f"{(key + ':').ljust(width)}  {value}".rstrip(), file=out)


# A number, a human amount (4Gi, 2.5, 25.0%) or a duration (3m12s): right-aligned in tables.
_NUMERIC = re.compile(r"^(-|[-+]?\d+(\.\d+)?([A-Za-z%]{0,2})(\d+[smh])?)$")


def _looks_numeric(text: str) -> bool:
    return bool(_NUMERIC.match(text))


def _plain(data: Any) -> Any:
    """JSON-shaped data YAML's safe dumper takes (tuples, datetimes and the like made plain)."""
    return json.loads(json.dumps(data, default=str))


def _as_lines(data: Any) -> TableView:
    if isinstance(data, Mapping):
        return {str(k): _cell(v) for k, v in data.items()}
    return str(data)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    return str(value)


# ---- human units -------------------------------------------------------------------------------

def share(fraction: float | None) -> str:
    """A share of the pool as a percentage: 0.25 -> 25.0%."""
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def duration(seconds: float | None) -> str:
    """3m12s, 2h5m, 4d3h; "-" for none."""
    return "-" if seconds is None else format_duration(seconds)


def amounts(values: Mapping[str, int | float] | None) -> str:
    """Canonical resource amounts in human units: "cpu 2, memory 4Gi"."""
    if not values:
        return "-"
    return ", ".join(f"{name} {format_amount(name, amount)}"
                     for name, amount in sorted(values.items()))


def age(timestamp: str | None, *, now: datetime | None = None) -> str:
    """How long ago an ISO 8601 timestamp was, as kubectl prints ages."""
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return format_duration(((now or datetime.now(UTC)) - then).total_seconds())


def parse_duration(text: str) -> float:
    """Seconds from "90", "90s", "15m", "2h", "1d", "1h30m" (argparse type: errors say how)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    number = ""
    try:
        if text.replace(".", "", 1).isdigit():
            total = float(text)
        else:
            for char in text.strip():
                if char.isdigit() or char == ".":
                    number += char
                elif char in units and number:
                    total += float(number) * units[char]
                    number = ""
                else:
                    raise ValueError(char)
            if number:
                raise ValueError(number)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (write e.g. 90s, 15m, 2h, 1d or 1h30m)") from error
    if total <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be positive, not {text!r}")
    return total


# ---- shared nouns --------------------------------------------------------------------------------

def verbs_of(nouns: Any, noun: str, help_text: str) -> Any:
    """The verb subparsers of `noun`, created on first use: modules share a noun this way."""
    # Kept on the subparsers object itself, so a parser built again starts afresh.
    shared: dict[str, Any] = nouns.__dict__.setdefault("_lockgate_verbs", {})
    verbs = shared.get(noun)
    if verbs is None:
        verbs = nouns.add_parser(noun, help=help_text).add_subparsers(dest="verb", required=True)
        shared[noun] = verbs
    return verbs
