"""How every `lockgate` command prints its answer: `-o table|wide|name|json|yaml|jsonpath=...`.

Why one module: each noun module only says what its answer is (the data, how it reads as a
table, what its objects are called); the formats, the column alignment and the human units
(cores, Gi, 3m12s, 25.0%) are the same everywhere, as in kubectl.

    render(out, output, View(data, table=lambda: Table([...], rows, wide=2),
                             names=lambda: ["queue/a"]))

- `table` (the default): aligned columns, numbers right-aligned; `wide` adds the last `wide`
  columns of a Table (kubectl's `-o wide`);
- `name`: one `KIND/NAME` per line, for `xargs` and scripts;
- `json`, `yaml`: the API's answer as it came;
- `jsonpath=TEMPLATE`: kubectl's JSONPath template over that same answer (`lockgate_cli.jsonpath`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import click
import yaml

from lockgate_cli.jsonpath import TemplateError, check_template, render_template

FORMATS = ("table", "wide", "name", "json", "yaml", "jsonpath=TEMPLATE")


@dataclass(frozen=True)
class Output:
    """A parsed `-o`: its kind, and the template of `jsonpath=`."""

    kind: str = "table"
    template: str = ""

    @property
    def structured(self) -> bool:
        return self.kind in ("json", "yaml", "jsonpath")


class OutputType(click.ParamType["Output"]):
    """`-o`: table, wide, name, json, yaml or jsonpath=TEMPLATE (checked as it is parsed)."""

    name = "format"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Output:
        if isinstance(value, Output):
            return value
        text = str(value)
        kind, sep, template = text.partition("=")
        if kind == "jsonpath" and sep:
            if not template:
                self.fail("jsonpath= needs a template, e.g. -o jsonpath='{.queues[*].queue}'",
                          param, ctx)
            try:
                check_template(template)
            except TemplateError as error:
                self.fail(str(error), param, ctx)
            return Output("jsonpath", template)
        if text in ("table", "wide", "name", "json", "yaml"):
            return Output(text)
        self.fail(f"{text!r} is not one of {', '.join(FORMATS)}", param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[click.shell_completion.CompletionItem]:
        choices = ("table", "wide", "name", "json", "yaml", "jsonpath=")
        return [click.shell_completion.CompletionItem(c) for c in choices
                if c.startswith(incomplete)]


def counted(n: int, noun: str) -> str:
    """"1 pod", "2 pods": a count and its noun, singular for one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def output_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """`-o/--output` on a command; the command receives `output: Output`."""
    return click.option(
        "-o", "--output", type=OutputType(), default="table", show_default=False,
        help="table (default), wide, name, json, yaml or jsonpath=TEMPLATE "
             "(kubectl's syntax over the answer -o json shows)")(function)


def output_option_for(example: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`output_option` whose help shows `example`, a template that prints something for this
    command's answer (a list's answer is not status's: each command gives its own)."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        return click.option(
            "-o", "--output", type=OutputType(), default="table", show_default=False,
            help="table (default), wide, name, json, yaml or jsonpath=TEMPLATE "
                 f"(kubectl's syntax, e.g. jsonpath='{example}')")(function)
    return decorate


@dataclass
class Table:
    """Rows of text under a header. The last `wide` columns show only with `-o wide`; `notes`
    print after it (e.g. hints), `empty` instead of an empty table."""

    header: list[str]
    rows: list[list[str]]
    wide: int = 0
    notes: list[str] = field(default_factory=list)
    empty: str = ""
    # Further tables shown only with -o wide, each under its title (`lockgate status`'s
    # clusters that grow).
    wide_sections: list[tuple[str, Table]] = field(default_factory=list)

    def narrowed(self, wide: bool) -> Table:
        if wide or not (self.wide or self.wide_sections):
            return self
        keep = len(self.header) - self.wide
        return Table(self.header[:keep], [row[:keep] for row in self.rows], 0, self.notes,
                     self.empty)


# What an answer reads as without -o json: one Table, "Key: value" lines, or text.
TableView = Table | Mapping[str, str] | str


@dataclass
class View:
    """An answer and how it reads: `table()` (default: the data as key/value lines) and
    `names()` (the `KIND/NAME` of each object, for -o name)."""

    data: Any
    table: Callable[[], TableView] | None = None
    names: Callable[[], list[str]] | None = None


def render(out: TextIO, output: Output, view: View) -> None:
    """Print `view` as `output` asks."""
    if dump_structured(out, output, view.data):
        return
    if output.kind == "name":
        if view.names is None:
            raise click.UsageError("-o name is not available here: use -o json or yaml")
        for name in view.names():
            print(name, file=out)
        return
    shown: TableView = view.table() if view.table is not None else _as_lines(view.data)
    if isinstance(shown, str):
        print(shown, file=out)
    elif isinstance(shown, Table):
        table = shown.narrowed(output.kind == "wide")
        if not table.rows and table.empty:
            print(table.empty, file=out)
        elif table.rows or table.header:
            print_table(out, table.header, table.rows)
        for note in table.notes:
            print(note if note.startswith("warning: ") else f"note: {note}", file=out)
        for title, section in table.wide_sections:
            print(f"\n{title}", file=out)
            if not section.rows and section.empty:
                print(section.empty, file=out)
            else:
                print_table(out, section.header, section.rows)
            for note in section.notes:
                print(note if note.startswith("warning: ") else f"note: {note}", file=out)
    else:
        print_fields(out, shown)


def dump_structured(out: TextIO, output: Output, data: Any) -> bool:
    """Print `data` as JSON, YAML or a JSONPath template; False for the other formats."""
    if output.kind == "json":
        json.dump(data, out, indent=2, default=str)
        print(file=out)
        return True
    if output.kind == "yaml":
        yaml.safe_dump(plain(data), out, sort_keys=False, default_flow_style=False,
                       allow_unicode=True)
        return True
    if output.kind == "jsonpath":
        text = render_template(output.template, plain(data))
        print(text, file=out, end="" if text.endswith("\n") else "\n")
        return True
    return False


def column_widths(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]], *,
                widths: Sequence[int] | None = None,
                numeric: Sequence[bool] | None = None) -> list[str]:
    """The lines of an aligned table (header first); a column of numbers and human amounts is
    right-aligned. `widths`/`numeric` fix the layout (a watch keeps its first table's)."""
    widths = list(widths) if widths is not None else column_widths(header, rows)
    if numeric is None:
        numeric = numeric_columns(header, rows)
    lines = []
    for row in [list(header), *rows]:
        cells = [str(cell) for cell in row]
        parts = [cell.rjust(width) if right else cell.ljust(width)
                 for cell, width, right in zip(cells, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return lines


def numeric_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[bool]:
    return [bool(rows) and all(_looks_numeric(str(row[i])) for row in rows)
            for i in range(len(header))]


def print_table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    for line in table_lines(header, rows):
        print(line, file=out)


def print_fields(out: TextIO, fields: Mapping[str, str]) -> None:
    """`Key:   value` lines, the values aligned (as `kubectl describe` prints)."""
    width = max((len(key) for key in fields), default=0) + 1
    for key, value in fields.items():
        print(f"{(key + ':').ljust(width)}  {value}".rstrip(), file=out)


# A number, a human amount (4Gi, 2.5, 25.0%) or a duration (3m12s): right-aligned in tables.
_NUMERIC = re.compile(r"^(-|[-+]?\d+(\.\d+)?([A-Za-z%]{0,2})(\d+[smh])?)$")


def _looks_numeric(text: str) -> bool:
    return bool(_NUMERIC.match(text))


def plain(data: Any) -> Any:
    """JSON-shaped data (tuples, datetimes and the like made plain) for YAML and JSONPath."""
    return json.loads(json.dumps(data, default=str))


def _as_lines(data: Any) -> TableView:
    if isinstance(data, Mapping):
        return {str(k): cell(v) for k, v in data.items()}
    return str(data)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return str(value)


# ---- human units -------------------------------------------------------------------------------

# The core's formatters (the Events on waiting pods use the same), imported on first use: the
# scheduler package is slow to load, and `--version`, `config` or `completion` need none of it.

def _format_duration(seconds: float) -> str:
    from lockgate.scheduler import format_duration

    return format_duration(seconds)


def _format_amount(resource: str, amount: float) -> str:
    from lockgate.scheduler import format_amount

    return format_amount(resource, amount)


def share(fraction: float | None) -> str:
    """A share of the pool as a percentage: 0.25 -> 25.0%."""
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def duration(seconds: float | None) -> str:
    """3m12s, 2h5m, 4d3h; "-" for none."""
    return "-" if seconds is None else _format_duration(seconds)


def amounts(values: Mapping[str, int | float] | None) -> str:
    """Canonical resource amounts in human units: "cpu 2, memory 4Gi"."""
    if not values:
        return "-"
    return ", ".join(f"{name} {_format_amount(name, amount)}"
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
    return _format_duration(((now or datetime.now(UTC)) - then).total_seconds())


def weight(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def timestamp(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else "-"
