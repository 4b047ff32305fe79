"""`--watch`: print the answer, then what changes, until Ctrl-C (as `kubectl get -w`).

Why polling: the admin API has no watch stream; a poll every `--interval` (2s) is cheap for
it (one query) and enough for a person. As kubectl does, the first answer prints whole and each
later one prints only the rows that are new or changed, in the first table's columns; a column
that changes by itself as time passes (an age, a wait) does not count as a change. JSON and
YAML print the whole answer again when it changes (YAML documents separated by `---`), `-o name`
the names that appear.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

import click

from lockgate_cli.output import (
    Output,
    Table,
    View,
    column_widths,
    dump_structured,
    numeric_columns,
    render,
    table_lines,
)


def watch_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """`-w/--watch` and `--interval` on a command."""
    from lockgate_cli.params import Duration

    function = click.option("--interval", type=Duration(), default="2s", show_default=True,
                            help="how often --watch asks the API")(function)
    return click.option("-w", "--watch", is_flag=True,
                        help="after the answer, print what changes until Ctrl-C")(function)


def show(out: TextIO, output: Output, fetch: Callable[[], View], *, watch: bool,
         interval: float, polls: int | None = None,
         sleep: Callable[[float], None] = time.sleep) -> None:
    """Print `fetch()`'s view once, or keep printing its changes (`polls` bounds it, for tests)."""
    if not watch:
        render(out, output, fetch())
        return
    printer = _ChangePrinter(out, output)
    done = 0
    try:
        while True:
            printer.show(fetch())
            out.flush()
            done += 1
            if polls is not None and done >= polls:
                return
            sleep(interval)
    except KeyboardInterrupt:
        return  # the usual way to end a watch


class _ChangePrinter:
    def __init__(self, out: TextIO, output: Output) -> None:
        self.out, self.output = out, output
        self.seen_rows: set[tuple[str, ...]] = set()
        self.seen_names: set[str] = set()
        self.last_key: Any = None
        self.layout: tuple[list[str], list[int], list[bool]] | None = None
        self.first = True

    def show(self, view: View) -> None:
        table = view.table() if view.table is not None else None
        if not isinstance(table, Table):
            table = None
        elif self.output.kind != "wide":
            table = table.narrowed(False)
        if self.output.structured:
            key = _stable(table) if table is not None else view.data
            if self.first or key != self.last_key:
                if self.output.kind == "yaml" and not self.first:
                    print("---", file=self.out)
                dump_structured(self.out, self.output, view.data)
            self.last_key = key
        elif self.output.kind == "name":
            names = view.names() if view.names is not None else []
            for name in names:
                if name not in self.seen_names:
                    print(name, file=self.out)
            self.seen_names.update(names)
        elif table is None:
            if self.first:
                render(self.out, self.output, view)
        else:
            self._rows(table)
        self.first = False

    def _rows(self, table: Table) -> None:
        masked = _stable(table)
        fresh = [row for row, key in zip(table.rows, masked, strict=True)
                 if key not in self.seen_rows]
        self.seen_rows.update(masked)
        if self.layout is None:
            if not table.rows:
                if self.first and table.empty:
                    print(table.empty, file=self.out)
                return
            self.layout = (table.header, column_widths(table.header, table.rows),
                           numeric_columns(table.header, table.rows))
            lines = table_lines(table.header, table.rows, widths=self.layout[1],
                                numeric=self.layout[2])
        else:
            header, widths, numeric = self.layout
            grown = column_widths(header, fresh) if fresh else widths
            widths = [max(a, b) for a, b in zip(widths, grown, strict=True)]
            self.layout = (header, widths, numeric)
            lines = table_lines(header, fresh, widths=widths, numeric=numeric)[1:]
        for line in lines:
            print(line, file=self.out)
        if self.first:
            for note in table.notes:
                print(f"note: {note}", file=self.out)


# Columns whose values move as time passes: not a change of the object.
VOLATILE_COLUMNS = frozenset({"AGE", "OLDEST-WAIT", "WAITED", "CREATED-AGO"})


def _stable(table: Table) -> list[tuple[str, ...]]:
    keep = [i for i, name in enumerate(table.header) if name not in VOLATILE_COLUMNS]
    return [tuple(str(row[i]) for i in keep) for row in table.rows]
