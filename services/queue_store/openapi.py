"""The admin API's OpenAPI 3.1 document, served at GET /api/v1/openapi.json (no token needed:
it describes the API's shape and holds no data).

Why written out here rather than generated: the routes are plain aiohttp, and the shapes they
answer with are built by hand in each module; a table of operations next to one another keeps
the document readable, and a unit test (tests/unit/test_openapi.py) compares it with the routes
the app really has, both ways, so neither can drift from the other.
"""

from __future__ import annotations

from typing import Any

PATH = "/api/v1/openapi.json"
VERSION = "1"

_STR = {"type": "string"}
_INT = {"type": "integer"}
_OBJ = {"type": "object"}
_ANY_OBJECT = {"type": "object", "additionalProperties": True}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _wrapped(key: str, item: dict[str, Any], **more: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": [key],
            "properties": {key: _array(item), **more}}


_PAGED = {"total": _INT, "offset": _INT, "limit": _INT}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error", "details"], "properties": {
        "error": _STR, "details": _array(_STR)}},
    "Queue": {"type": "object", "required": ["name"], "properties": {
        "name": _STR, "priority_factor": {"type": "number", "exclusiveMinimum": 0},
        "weight": {"type": "number", "readOnly": True}, "cordoned": {"type": "boolean"},
        "resource_limits": {"type": "object", "additionalProperties": _STR,
                            "description": "what it (an inner node: its subtree) never holds "
                            "more of, borrowing included"},
        "parent": {"type": ["string", "null"], "description": "the queue tree's parent queue "
                   "(null: a child of the root)"},
        "guarantee": {"type": "object", "additionalProperties": _STR,
                      "description": "what it (its subtree) gets when it asks for it"},
        "namespaces": _array({"type": "object", "properties": {
            "cluster": _STR, "names": _array(_STR), "selector": _ANY_OBJECT}}),
        "max_queued": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
            "seconds": _INT, "action": {"enum": ["fail", "delete"]}}}]},
        "group_timeout_seconds": {"type": ["number", "null"]},
        "group_timeout_action": _STR,
        "allowed_kinds": {"type": ["array", "null"], "items": _STR},
        "allowed_kinds_default": {"type": "boolean", "readOnly": True},
        "created_at": {"type": ["string", "null"], "format": "date-time", "readOnly": True},
        "updated_at": {"type": ["string", "null"], "format": "date-time", "readOnly": True},
        "warnings": {"type": "array", "items": _STR, "readOnly": True,
                     "description": "in answers to a create or update only: the namespaces it "
                     "binds that lockgate's webhook will not serve, and why"}}},
    "Job": {"type": "object", "properties": {
        "cluster": _STR, "uid": _STR, "namespace": _STR, "name": _STR, "queue": _STR,
        "jobset": _STR, "priority": _INT, "requests": {"type": "object",
                                                       "additionalProperties": _INT},
        "state": {"enum": ["queued", "released", "ungated", "bound", "running", "succeeded",
                           "failed", "deleted", "cancelled"]},
        "node_name": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "state_changed_at": {"type": "string", "format": "date-time"},
        "decision_id": {"type": ["string", "null"]}, "release_attempts": _INT,
        "last_reason": _STR,
        "skipped_gate": {"type": "boolean", "description": "lockgate never gated the pod: it "
                         "ran without waiting its turn, and counts as its queue's usage"}}},
    "WaitingPod": {"allOf": [_ref("Job"), {"type": "object", "properties": {
        "position": _INT, "reason": {"type": ["string", "null"]},
        "message": {"type": ["string", "null"]}}}]},
    "JobSetSummary": {"type": "object", "properties": {
        "queue": _STR, "jobset": _STR, "clusters": _array(_STR), "namespaces": _array(_STR),
        "pods": _INT, "unfinished": _INT, "by_state": {"type": "object",
                                                       "additionalProperties": _INT},
        "oldest_queued_at": {"type": ["string", "null"]}, "first_created_at": _STR,
        "last_changed_at": _STR}},
    "Namespace": {"type": "object", "properties": {
        "cluster": _STR, "name": _STR, "queue": _STR, "jobset": _STR, "service_account": _STR,
        "state": {"enum": ["active", "expiring", "deleting", "deleted", "failed"]},
        "ttl_seconds": {"type": ["integer", "null"]}, "expires_at": {"type": ["string", "null"]},
        "created_at": _STR, "state_changed_at": _STR, "trigger": {"type": ["string", "null"]},
        "failure_reason": {"type": ["string", "null"]}, "attempts": _INT,
        "next_attempt_at": {"type": ["string", "null"]},
        "deleted_at": {"type": ["string", "null"]}, "max_queued": _ANY_OBJECT}},
    "Transition": {"type": "object", "properties": {
        "from_state": {"type": ["string", "null"]}, "to_state": _STR, "cause": _STR,
        "at": {"type": "string", "format": "date-time"}}},
    "NamespaceCredentials": {"type": "object", "properties": {
        "namespace": _ref("Namespace"), "token": _STR,
        "token_expires_at": {"type": ["string", "null"]}, "kubeconfig": _STR}},
    "Command": {"type": "object", "properties": {
        "command_id": _STR, "reason": _STR, "requested_by": _STR, "at": _STR}},
    "Eviction": {"type": "object", "properties": {
        "eviction_id": _STR, "cluster": _STR, "uid": _STR, "namespace": _STR, "name": _STR,
        "queue": _STR, "kind": {"enum": ["preempted", "group_timeout"]},
        "action": {"enum": ["delete", "fail"]}, "for_queue": {"type": ["string", "null"]},
        "for_uid": {"type": ["string", "null"]}, "message": _STR, "decided_at": _STR,
        "decided_by": _STR, "published_at": {"type": ["string", "null"]}}},
    "Explanation": _ANY_OBJECT,
    "Reason": {"type": "object", "properties": {"reason": {"type": "string", "maxLength": 1024}}},
}


def _query(name: str, description: str, schema: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema or _STR}


_PAGE_PARAMS = [_query("offset", "rows to skip", {"type": "integer", "minimum": 0}),
                _query("limit", "rows in the page (1-500, default 50)",
                       {"type": "integer", "minimum": 1, "maximum": 500})]

# (method, path, summary, query parameters, request body schema or None, 2xx status, answer)
_OPERATIONS: list[tuple[str, str, str, list[dict[str, Any]], dict[str, Any] | None, int,
                        dict[str, Any] | None]] = [
    ("get", "/api/v1/openapi.json", "This document (no token needed)", [], None, 200, _OBJ),
    ("get", "/api/v1/queues", "List the queues", [], None, 200,
     _wrapped("queues", _ref("Queue"))),
    ("post", "/api/v1/queues", "Create a queue (409 if it exists)", [], _ref("Queue"), 201,
     _ref("Queue")),
    ("get", "/api/v1/queues/{name}", "One queue", [], None, 200, _ref("Queue")),
    ("put", "/api/v1/queues/{name}", "Replace a queue's spec (omitted fields take defaults)",
     [], _ref("Queue"), 200, _ref("Queue")),
    ("patch", "/api/v1/queues/{name}", "JSON merge patch of a queue (RFC 7386)", [],
     _ANY_OBJECT, 200, _ref("Queue")),
    ("delete", "/api/v1/queues/{name}", "Delete a queue", [], None, 204, None),
    ("get", "/api/v1/queues/{name}/waiting",
     "The queue's queued pods in release order, with position and why each waits",
     [_query("cluster", "only pods of this cluster (positions stay the queue's)"),
      _query("namespace", "only pods of this namespace"), *_PAGE_PARAMS], None, 200,
     _wrapped("pods", _ref("WaitingPod"), queue=_STR, queued_in_queue=_INT,
              reasons_as_of=_STR, **_PAGED)),
    ("get", "/api/v1/jobs", "Unfinished jobs, oldest first, with why each waits and hints",
     [_query("queue", "queue name"), _query("state", "job state"),
      _query("cluster", "cluster name"), _query("all", "true: ended jobs too"),
      _query("limit", "at most this many (1-10000)", _INT)], None, 200,
     _wrapped("jobs", {"allOf": [_ref("Job"), {"type": "object", "properties": {
         "reason": {"type": ["string", "null"]}}}]}, hints=_array(_STR), total=_INT,
              unfinished_only={"type": "boolean"},
              reasons_unavailable={"type": ["string", "null"]})),
    ("get", "/api/v1/status", "Every queue's standing and pods by phase",
     [_query("clusters", "1: each queue's target and share in every cluster too "
             "(cluster_targets, cluster_shares, clusters)")], None, 200,
     _wrapped("queues", _ANY_OBJECT, at=_STR)),
    ("get", "/api/v1/explain/{cluster}/{namespace}/{pod}", "Why a pod waits", [], None, 200,
     {"type": "object", "properties": {"pod": _ANY_OBJECT, "explanation": _ref("Explanation"),
                                       "message": _STR}}),
    ("get", "/api/v1/jobsets", "Job sets with their pods by state",
     [_query("queue", "queue name"), _query("all", "true: finished job sets too"),
      _query("limit", "at most this many (1-10000)", _INT),
      _query("offset", "job sets to skip", _INT)], None, 200,
     _wrapped("jobsets", _ref("JobSetSummary"))),
    ("get", "/api/v1/jobsets/{queue}/{jobset}", "A job set's summary and first 500 jobs", [],
     None, 200, {"allOf": [_ref("JobSetSummary"), _wrapped("jobs", _ref("Job"))]}),
    ("get", "/api/v1/jobsets/{queue}/{jobset}/pods",
     "A page of a job set's pods, and its pods counted by cluster and state",
     [_query("cluster", "cluster name"), _query("state", "job state"), *_PAGE_PARAMS], None,
     200, _wrapped("pods", _ref("Job"), counts=_ANY_OBJECT, queue=_STR, jobset=_STR,
                   **_PAGED)),
    ("post", "/api/v1/jobsets/{queue}/{jobset}/cancel",
     "Cancel a job set (admin): 202 once Kafka holds the command", [], _ref("Reason"), 202,
     _ref("Command")),
    ("get", "/api/v1/jobsets/{queue}/{jobset}/cancellation",
     "The recorded cancel of a job set, with its namespaces", [], None, 200, _ANY_OBJECT),
    ("post", "/api/v1/namespaces", "Create an ephemeral namespace (idempotent)", [],
     {"type": "object", "required": ["queue", "jobset", "cluster"], "properties": {
         "queue": _STR, "jobset": _STR, "cluster": _STR, "ttl_seconds": _INT,
         "max_queued": _ANY_OBJECT}}, 201, _ref("NamespaceCredentials")),
    ("get", "/api/v1/namespaces", "Ephemeral namespaces",
     [_query("queue", "queue name"), _query("jobset", "job set"),
      _query("cluster", "cluster name"), _query("state", "namespace state"), *_PAGE_PARAMS],
     None, 200, _wrapped("namespaces", _ref("Namespace"), total=_INT)),
    ("get", "/api/v1/namespaces/{cluster}/{name}",
     "An ephemeral namespace with its transitions and allowed kinds", [], None, 200,
     {"allOf": [_ref("Namespace"), _wrapped("transitions", _ref("Transition"))]}),
    ("delete", "/api/v1/namespaces/{cluster}/{name}",
     "Delete an ephemeral namespace (admin): 202 once Kafka holds the command", [],
     _ref("Reason"), 202, _ref("Namespace")),
    ("get", "/api/v1/namespaces/{cluster}/{name}/transitions",
     "An ephemeral namespace's transitions", [], None, 200,
     _wrapped("transitions", _ref("Transition"), namespace=_ref("Namespace"))),
    ("post", "/api/v1/namespaces/{cluster}/{name}/token",
     "A fresh coordinator token for an active namespace (admin)", [], None, 200,
     _ref("NamespaceCredentials")),
    ("get", "/api/v1/whoami", "The caller's token name and role", [], None, 200,
     {"type": "object", "properties": {"name": _STR, "role": {"enum": ["read-only", "admin"]},
                                       "may_act": {"type": "boolean"}}}),
    ("get", "/api/v1/fairness",
     "The fair-scheduler leader's newest report (per queue; per cluster too with "
     "clusters=1; report.tree: the queue tree, as `lockgate status --tree`)",
     [_query("clusters", "1: each queue's target and share in every cluster too"),
      _query("queue", "only this queue's entry (a queue's page)")], None, 200,
     {"type": "object", "properties": {"source": _STR, "sampled_at": _STR,
                                       "report": _ANY_OBJECT}}),
    ("get", "/api/v1/fairness/history", "Samples of every queue's fair and actual shares",
     [_query("since", "only samples after this ISO 8601 time")], None, 200,
     _wrapped("samples", _ANY_OBJECT, interval_seconds={"type": "number"})),
    ("get", "/api/v1/clusters",
     "Each cluster's nodes and capacity, and what each queue holds and has waiting there",
     [], None, 200, _wrapped("clusters", _ANY_OBJECT)),
    ("get", "/api/v1/pods/{cluster}/{namespace}/{pod}",
     "One pod's journey (created, queued, released, bound, ended), explanation, eviction and "
     "trace link", [], None, 200,
     {"type": "object", "properties": {
         "pod": _ref("Job"), "journey": _array(_ANY_OBJECT), "eviction": _ANY_OBJECT,
         "explanation": _ANY_OBJECT, "message": _STR, "trace_id": {"type": ["string", "null"]},
         "trace_url": {"type": ["string", "null"]}}}),
    ("get", "/api/v1/pods/{cluster}/{namespace}/{pod}/trace",
     "One pod's trace as a waterfall (the same rows as `lockgate trace -o json`), read from the "
     "trace store's query API (LOCKGATE_QUEUE_STORE_UI__TRACES_URL); 503 when it does not "
     "answer", [], None, 200,
     {"type": "object", "properties": {
         "trace_id": {"type": ["string", "null"]}, "store": {"type": ["string", "null"]},
         "message": {"type": ["string", "null"]}, "total_us": {"type": "integer"},
         "services": _array(_STR), "spans": _array(_ANY_OBJECT)}}),
    ("get", "/api/v1/evictions", "Evictions (preempted, group timed out), newest first",
     [_query("queue", "the evicted pod's queue"), _query("cluster", "cluster name"),
      *_PAGE_PARAMS], None, 200, _wrapped("evictions", _ref("Eviction"), **_PAGED)),
]

_ERRORS = {
    "400": "invalid input", "401": "no token, or an unknown one",
    "403": "a read-only token on a call that changes something", "404": "not found",
    "409": "conflicts with what exists", "503": "a dependency (Postgres, Kafka) is unavailable",
}


def _parameters_of(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [{"name": name, "in": "path", "required": True, "schema": _STR} for name in names]


def operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every documented operation."""
    return [(method.upper(), path) for method, path, *_ in _OPERATIONS]


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, query, body, status, answer in _OPERATIONS:
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method}_{path.removeprefix('/api/v1/')}".replace("/", "_")
            .replace("{", "").replace("}", "").replace(".", "_"),
            "parameters": _parameters_of(path) + query,
            "responses": {str(status): {"description": "done"} if answer is None else {
                "description": "done", "content": {"application/json": {"schema": answer}}}},
        }
        for code, description in _ERRORS.items():
            operation["responses"][code] = {"description": description, "content": {
                "application/json": {"schema": _ref("Error")}}}
        if path == PATH:
            operation["security"] = []
            operation["responses"] = {"200": operation["responses"]["200"]}
        if body is not None:
            operation["requestBody"] = {"required": method != "delete", "content": {
                "application/json": {"schema": body}}}
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "lockgate admin API", "version": VERSION,
                 "description": "Queues, jobs, job sets, ephemeral namespaces and the views "
                                "behind `lockgate` and the web UI (/ui/). Every call but this "
                                "document's needs `Authorization: Bearer <token>`; read-only "
                                "tokens may only read."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": SCHEMAS},
        "paths": paths,
    }
