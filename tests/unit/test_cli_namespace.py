"""`lockgate namespace ...` without a server: durations, what create sends and prints."""

from __future__ import annotations

from recorded_api import CLUSTERS, RecordedApi


def credentials(request_body: dict[str, object] | None = None) -> dict[str, object]:
    body = request_body or {}
    record = {"cluster": "cluster-a", "name": "n", "state": "active", "queue": "q",
              "jobset": "j", "service_account": "lockgate-coordinator", "expires_at": None,
              "max_queued": body.get("max_queued")}
    return {"namespace": record, "token": "t", "token_expires_at": None,
            "kubeconfig": {"apiVersion": "v1"}}


def api() -> RecordedApi:
    recorded = RecordedApi().on("GET", "/api/v1/clusters", CLUSTERS)
    return recorded.on("POST", "/api/v1/namespaces",
                       lambda request: (201, credentials(recorded.sent[-1].body)))


def test_namespace_create_takes_human_durations_and_says_what_it_made() -> None:
    recorded = api()
    ran = recorded.run("namespace", "create", "--queue", "q", "--jobset", "j", "--cluster",
                       "cluster-a", "--ttl", "2h", "--max-queued-time", "30m",
                       "--on-max-queued", "delete")
    assert ran.code == 0, ran.err
    (body,) = recorded.bodies("POST")
    assert body == {"queue": "q", "jobset": "j", "cluster": "cluster-a", "ttl_seconds": 7200,
                    "max_queued": {"seconds": 1800, "action": "delete"}}
    assert "its pods wait at most 30m queued, then are deleted" in ran.out
    assert "kubeconfig for the coordinator:" in ran.out


def test_bad_durations_and_lone_actions_are_usage_errors_that_say_what_to_write() -> None:
    bad = api().run("namespace", "create", "--queue", "q", "--jobset", "j", "--cluster",
                    "cluster-a", "--ttl", "two hours")
    assert bad.code == 2 and "e.g. 20s, 5m, 2h, 1d, 1h30m, or bare seconds" in bad.err
    lone = api().run("namespace", "create", "--queue", "q", "--jobset", "j", "--cluster",
                     "cluster-a", "--on-max-queued", "fail")
    assert lone.code == 2 and "--on-max-queued needs --max-queued-time" in lone.err


def test_an_unknown_cluster_is_refused_before_anything_is_made() -> None:
    recorded = api()
    ran = recorded.run("namespace", "create", "--queue", "q", "--jobset", "j", "--cluster",
                       "cluster-z")
    assert ran.code == 1
    assert "lockgate namespace create: unknown cluster 'cluster-z' in --cluster; lockgate " \
           "knows cluster-a, cluster-b" in ran.err
    assert recorded.bodies("POST") == []


def test_describe_needs_cluster_and_name() -> None:
    ran = RecordedApi().run("namespace", "describe", "just-a-name")
    assert ran.code == 2 and "CLUSTER/NAME" in ran.err
    assert ran.err.startswith("lockgate namespace describe: ")
