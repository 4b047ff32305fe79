"""kubectl's JSONPath templates for `-o jsonpath=...`: `{.queues[*].queue}`, `{range}`, `{"\\n"}`.

Why kubectl's dialect: that is what users type after years of `kubectl get -o jsonpath`. The
expressions themselves are evaluated by jsonpath-ng (its extended parser, so filters like
`[?(@.cordoned == true)]` work); this module only parses the template around them: literal text,
`{EXPR}` (relative to the current object: the answer, or the item of the enclosing range),
`{range EXPR}...{end}` and string literals `{"\\t"}`. As kubectl, several results of one
expression are joined by a space, strings print bare and objects as JSON, and a key that is
missing prints nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jsonpath_ng.exceptions import JSONPathError
from jsonpath_ng.ext.parser import parse

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


class TemplateError(ValueError):
    """A template that cannot be parsed; the message says where."""


@dataclass
class _Node:
    kind: str  # "text", "expr", "range"
    value: str = ""
    body: list[_Node] = field(default_factory=list)


def render_template(template: str, data: Any) -> str:
    """`template` filled from `data`."""
    nodes = _parse(template)
    return "".join(_render(nodes, data, root=data))


def check_template(template: str) -> None:
    """Raise TemplateError unless `template` parses (every expression too)."""
    for node in _walk(_parse(template)):
        if node.kind in ("expr", "range"):
            _compile(node.value)


def _walk(nodes: list[_Node]) -> list[_Node]:
    found: list[_Node] = []
    for node in nodes:
        found.append(node)
        found.extend(_walk(node.body))
    return found


def _tokens(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("brace", inside) pieces; a quoted string inside braces may hold }."""
    tokens: list[tuple[str, str]] = []
    text, i = "", 0
    while i < len(template):
        char = template[i]
        if char != "{":
            text += char
            i += 1
            continue
        if text:
            tokens.append(("text", text))
            text = ""
        j, quoted = i + 1, False
        while j < len(template) and (quoted or template[j] != "}"):
            if template[j] == "\\" and quoted:
                j += 1
            elif template[j] == '"':
                quoted = not quoted
            j += 1
        if j >= len(template):
            raise TemplateError(f"unclosed {{ at position {i} of {template!r}")
        tokens.append(("brace", template[i + 1:j].strip()))
        i = j + 1
    if text:
        tokens.append(("text", text))
    return tokens


def _parse(template: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[list[_Node]] = [root]
    for kind, value in _tokens(template):
        if kind == "text":
            stack[-1].append(_Node("text", value))
        elif value.startswith('"'):
            stack[-1].append(_Node("text", _unquote(value)))
        elif value == "end":
            if len(stack) == 1:
                raise TemplateError(f"{{end}} without a {{range}} in {template!r}")
            stack.pop()
        elif value.startswith("range "):
            node = _Node("range", value.removeprefix("range ").strip())
            stack[-1].append(node)
            stack.append(node.body)
        else:
            stack[-1].append(_Node("expr", value))
    if len(stack) != 1:
        raise TemplateError(f"{{range}} without an {{end}} in {template!r}")
    return root


def _unquote(literal: str) -> str:
    if len(literal) < 2 or not literal.endswith('"'):
        raise TemplateError(f"unterminated string {literal!r}")
    out, i, inner = "", 0, literal[1:-1]
    while i < len(inner):
        if inner[i] == "\\" and i + 1 < len(inner):
            out += _ESCAPES.get(inner[i + 1], inner[i + 1])
            i += 2
        else:
            out += inner[i]
            i += 1
    return out


def _compile(expression: str) -> Any:
    """jsonpath-ng's path for a kubectl expression (`.a.b`, `[0].a`, `@`, `$.a`)."""
    text = expression.strip()
    if text in ("", "@", "$", "."):
        text = "$"
    elif text.startswith(".") or text.startswith("["):
        text = "$" + text
    elif not text.startswith(("$", "@")):
        text = "$." + text
    try:
        return parse(text)
    except JSONPathError as error:
        raise TemplateError(f"cannot parse {{{expression}}}: {error}") from error


def _matches(expression: str, current: Any, root: Any) -> list[Any]:
    target = root if expression.strip().startswith("$") else current
    return [match.value for match in _compile(expression).find(target)]


def _render(nodes: list[_Node], current: Any, *, root: Any) -> list[str]:
    parts: list[str] = []
    for node in nodes:
        if node.kind == "text":
            parts.append(node.value)
        elif node.kind == "expr":
            parts.append(" ".join(_text(value) for value in _matches(node.value, current, root)))
        else:
            for item in _items(_matches(node.value, current, root)):
                parts.extend(_render(node.body, item, root=root))
    return parts


def _items(values: list[Any]) -> list[Any]:
    """What a range walks: the elements of one list result, else the results themselves."""
    if len(values) == 1 and isinstance(values[0], list):
        return list(values[0])
    return values


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return f"{value}"
    return json.dumps(value, separators=(",", ":"), default=str)
