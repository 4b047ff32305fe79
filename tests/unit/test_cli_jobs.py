"""`lockgate jobs list` (issue 38, item 4): unfinished jobs by default, says when a page is cut,
REASON from the scheduler, and a help example that prints something."""

from __future__ import annotations

import json
import re

import pytest
from recorded_api import CLUSTERS, RecordedApi


def a_job(name: str, *, state: str = "queued", reason: str | None = None,
          last_reason: str = "") -> dict[str, object]:
    return {"cluster": "cluster-a", "uid": f"u-{name}", "namespace": "team", "name": name,
            "queue": "q", "jobset": "js", "priority": 0, "requests": {"cpu": 1000},
            "state": state, "node_name": None, "created_at": "2026-01-01T00:00:00+00:00",
            "state_changed_at": "2026-01-01T00:00:00+00:00", "decision_id": None,
            "release_attempts": 0, "last_reason": last_reason, "reason": reason}


def jobs_api(*jobs: dict[str, object], total: int | None = None) -> RecordedApi:
    return RecordedApi().on("GET", "/api/v1/jobs", {
        "jobs": list(jobs), "total": len(jobs) if total is None else total, "hints": []})


def test_unfinished_jobs_by_default_and_all_for_the_rest() -> None:
    recorded = jobs_api()
    default = recorded.run("jobs", "list")
    assert default.sent[-1].query == {"limit": "100"}
    assert default.out == "no unfinished jobs (--all for those that ended)\n"
    everything = recorded.run("jobs", "list", "--all", "--queue", "q")
    assert everything.sent[-1].query == {"limit": "100", "queue": "q", "all": "true"}
    assert everything.out == "no jobs with queue=q\n"


def test_a_cut_page_says_how_many_it_shows_of_how_many() -> None:
    ran = jobs_api(a_job("a"), a_job("b"), total=250).run("jobs", "list", "--limit", "2")
    assert ran.out.splitlines()[-1] == "note: showing 2 of 250 (--limit for more)"
    whole = jobs_api(a_job("a"), a_job("b")).run("jobs", "list")
    assert "showing" not in whole.out


def test_without_the_leader_the_table_says_reasons_are_unavailable() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/jobs", {
        "jobs": [a_job("a")], "total": 1, "hints": [],
        "reasons_unavailable": "no fair-scheduler leader answers"})
    assert recorded.run("jobs", "list").out.splitlines()[-1] == (
        "note: REASON is what Postgres keeps: no fair-scheduler leader answers")


def test_reason_is_the_schedulers_and_else_why_the_job_ended() -> None:
    ran = jobs_api(a_job("big", reason="node_fit"),
                   a_job("done", state="failed", reason="OOMKilled", last_reason="OOMKilled"),
                   a_job("new")).run("jobs", "list", "--all")
    header, *rows = ran.out.splitlines()
    reasons = {row.split()[2]: row[header.index("REASON"):].split()[0] for row in rows}
    assert reasons == {"big": "node_fit", "done": "OOMKilled", "new": "-"}


@pytest.mark.parametrize(("command", "path", "answer"), [
    (["jobs", "list"], "/api/v1/jobs", {"jobs": [a_job("a")], "total": 1, "hints": []}),
    (["status"], "/api/v1/status", {"at": "2026-01-01T00:00:00+00:00",
                                    "queues": [{"queue": "q"}]}),
    (["queue", "list"], "/api/v1/queues", {"queues": [{"name": "q"}]}),
    (["cluster", "list"], "/api/v1/clusters", CLUSTERS),
    (["jobset", "list"], "/api/v1/jobsets", {"jobsets": [{"queue": "q", "jobset": "js"}]}),
    (["namespace", "list"], "/api/v1/namespaces", {"namespaces": [{"name": "ns"}]}),
])
def test_the_helps_jsonpath_example_prints_something(
        command: list[str], path: str, answer: dict[str, object],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: the help's example ({.queues[*].queue}, status's) printed nothing for jobs."""
    recorded = RecordedApi().on("GET", path, answer)
    helped = recorded.run(*command, "--help")
    text = helped.out + capsys.readouterr().out  # click prints --help to the real stdout
    (example,) = re.findall(r"jsonpath='([^']+)'", " ".join(text.split()))
    ran = recorded.run(*command, "-o", f"jsonpath={example}")
    assert ran.code == 0, ran.err
    assert ran.out.strip(), (example, json.dumps(answer))


def test_a_job_set_of_one_pod_says_one_pod() -> None:
    """Issue 38, item 7: "1 pods (1 queued)"."""
    summary = {"queue": "a", "jobset": "solo", "clusters": ["c1"], "namespaces": ["n"],
               "pods": 1, "unfinished": 1, "by_state": {"queued": 1}, "oldest_queued_at": None,
               "first_created_at": "2026-01-01T00:00:00+00:00",
               "last_changed_at": "2026-01-01T00:00:00+00:00"}
    recorded = RecordedApi().on("GET", "/api/v1/jobsets/a/solo", {
        **summary, "jobs_shown": 1, "jobs": [a_job("p")]})
    described = recorded.run("jobset", "describe", "a", "solo")
    assert "Job set solo in queue a: 1 pod (1 queued), clusters c1" in described.out


@pytest.mark.parametrize("sent", [1767225600, 1767225600.0, "2026-01-01T00:00:00+00:00"])
def test_status_shows_the_oldest_queued_time_in_iso_as_every_other_time(
        sent: object) -> None:
    """Issue 38, item 7: `status -o yaml` gave oldest_queued_at in epoch seconds."""
    status = {"at": "2026-01-01T00:05:00+00:00", "queues": [
        {"queue": "q", "defined": True, "cordoned": False, "weight": 1.0, "fair_share": 1.0,
         "adjusted_fair_share": 1.0, "actual_share": 0.0, "queued": 1, "released": 0,
         "running": 0, "oldest_queued_at": sent, "oldest_wait_seconds": 300}]}
    ran = RecordedApi().on("GET", "/api/v1/status", status).run("status", "-o", "json")
    assert ran.code == 0, ran.err
    (queue,) = json.loads(ran.out)["queues"]
    assert queue["oldest_queued_at"] == "2026-01-01T00:00:00+00:00"
    yaml = RecordedApi().on("GET", "/api/v1/status", status).run("status", "-o", "yaml").out
    assert "oldest_queued_at: '2026-01-01T00:00:00+00:00'" in yaml, yaml
