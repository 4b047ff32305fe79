"""The admin API's OpenAPI document against the routes the app really has, both ways."""

from __future__ import annotations

import re
from typing import Any, cast

import asyncpg

from lockgate_adapters.admin_tokens import Role, entry_for
from queue_store import openapi
from queue_store.app import admin_api
from queue_store.namespaces import NamespaceKeeper
from queue_store.settings import QueueStoreSettings


async def _no_publish(_: Any, __: Any) -> None:
    raise AssertionError("nothing is published while routes are listed")


def _routes() -> set[tuple[str, str]]:
    settings = QueueStoreSettings(
        admin_tokens=[entry_for("t", Role.ADMIN, "x").line()],
        postgres_dsn="postgresql://unused@127.0.0.1:1/unused", kafka_bootstrap="127.0.0.1:1")
    keeper = NamespaceKeeper(apis={}, extra_labels={}, token_seconds=3600, create_any=True)
    admin, *_ = admin_api(cast(asyncpg.Pool, None), settings, publish=_no_publish,
                         keeper=keeper)
    found = set()
    for route in admin.app().router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter") or ""
        if route.method == "HEAD" or not path.startswith("/api/"):
            continue  # HEAD comes with every GET; the UI's files are not the API
        found.add((route.method, path))
    return found


def test_every_route_is_documented_and_nothing_else() -> None:
    routes = _routes()
    documented = set(openapi.operations())
    assert routes - documented == set(), "routed but not in the OpenAPI document"
    assert documented - routes == set(), "documented but not routed"
    assert len(routes) > 20


def test_the_document_is_well_formed() -> None:
    doc = openapi.document()
    assert doc["openapi"].startswith("3.")
    for path, operations in doc["paths"].items():
        placeholders = set(re.findall(r"{(\w+)}", path))
        for method, operation in operations.items():
            declared = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert declared == placeholders, f"{method} {path}: path parameters"
            assert any(code.startswith("2") for code in operation["responses"]), path
    refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', str(doc).replace("'", '"'))
    assert refs and set(refs) <= set(doc["components"]["schemas"])
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
