"""Every command's output: aligned tables with human units, JSON and YAML (cli_output, cli_views).

The API is replaced by a recorded answer: what is tested here is the rendering, not the API."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest
import yaml

from lockgate_adapters import cli, cli_views
from lockgate_adapters.cli_output import Table, parse_duration, print_table, render, verbs_of


def rendered(output: str, data: Any, table: Any = None) -> str:
    out = io.StringIO()
    render(out, output, data, table=table)
    return out.getvalue()


def test_tables_align_columns_and_right_align_numbers_and_units() -> None:
    out = io.StringIO()
    print_table(out, ["QUEUE", "QUEUED", "SHARE", "OLDEST"],
                [["a", "3", "25.0%", "3m12s"], ["longer-name", "120", "5.5%", "45s"]])
    assert out.getvalue().splitlines() == [
        "QUEUE        QUEUED  SHARE  OLDEST",
        "a                 3  25.0%   3m12s",
        "longer-name     120   5.5%     45s",
    ]


def test_the_same_answer_as_json_and_yaml() -> None:
    data = {"queues": [{"queue": "a", "share": 0.25, "clusters": ("x", "y")}]}
    assert json.loads(rendered("json", data)) == {
        "queues": [{"queue": "a", "share": 0.25, "clusters": ["x", "y"]}]}
    assert yaml.safe_load(rendered("yaml", data)) == json.loads(rendered("json", data))


def test_an_empty_table_says_what_to_do_and_notes_follow() -> None:
    assert rendered("table", [], lambda: Table(["A"], [], empty="nothing: do X")) \
        == "nothing: do X\n"
    assert rendered("table", [], lambda: Table(["A"], [["1"]], notes=["n"])) == "A\n1\nnote: n\n"


def test_a_mapping_without_a_table_reads_as_aligned_fields() -> None:
    assert rendered("table", {"Queue": "a", "Cordoned": True, "Limits": None}).splitlines() == [
        "Queue:     a", "Cordoned:  yes", "Limits:    -"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
])
def test_durations_are_parsed(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "m5", "0", "1h30"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 90s|positive"):
        parse_duration(text)


class Recorded:
    """An admin client that answers every request with one recorded answer."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, Any]] = []
        self.bodies: list[Any] = []

    def request(self, method: str, path: str, body: object = None,
                query: dict[str, str] | None = None) -> Any:
        self.requests.append((method, path, query))
        self.bodies.append(body)
        return self.answer


def run(argv: list[str], answer: Any) -> tuple[str, Recorded]:
    args = cli.build_parser().parse_args(argv)
    client = Recorded(answer)
    out = io.StringIO()
    args.run(client, args, out)
    return out.getvalue(), client


STATUS = {"at": "2026-01-01T00:00:00+00:00", "queues": [
    {"queue": "team-a", "defined": True, "cordoned": False, "weight": 2.0, "fair_share": 2 / 3,
     "adjusted_fair_share": 0.75, "actual_share": 0.5, "queued": 12, "unschedulable": 1,
     "released": 2, "running": 30, "oldest_queued_at": 0, "oldest_wait_seconds": 192,
     "max_queued_seconds": 3600, "fair_target": 0.625,
     "cluster_targets": {"cluster-a": 0.625}, "cluster_shares": {"cluster-a": 0.5}},
    {"queue": "b", "defined": True, "cordoned": True, "weight": 1.0, "fair_share": 1 / 3,
     "adjusted_fair_share": 0.25, "actual_share": 0.0, "queued": 0, "unschedulable": 0,
     "released": 0, "running": 0, "oldest_queued_at": None, "oldest_wait_seconds": None,
     "max_queued_seconds": None}]}


def test_status_shows_shares_as_percentages_and_the_oldest_wait_as_a_duration() -> None:
    text, client = run(["status"], STATUS)
    assert client.requests == [("GET", "/api/v1/status", None)]
    header, team_a, b = text.splitlines()
    assert header.split() == ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED", "ACTUAL", "TARGET",
                              "BY-CLUSTER", "QUEUED", "RELEASED", "RUNNING", "OLDEST-WAIT",
                              "NOTE"]
    assert team_a.split()[:12] == ["team-a", "2", "66.7%", "75.0%", "50.0%", "62.5%",
                                   "cluster-a", "50.0%/62.5%", "12", "2", "30", "3m12s"]
    assert "1 fit no node" in team_a and "max queued 1h" in team_a
    assert b.split()[5:7] == ["0.0%", "-"]
    assert b.split()[10:] == ["-", "cordoned"]
    assert yaml.safe_load(run(["status", "-o", "yaml"], STATUS)[0]) == STATUS


EXPLAINED = {"pod": {"cluster": "c", "namespace": "n", "name": "p", "uid": "u", "jobset": "j",
                     "state": "queued", "last_reason": ""},
             "message": 'queue "a", position 2 of 5; fits no node', "explanation": {
                 "job_id": "c/u", "cluster": "c", "queue": "a", "state": "queued",
                 "reason": "node_fit", "position": 2, "queued_in_queue": 5,
                 "waited_seconds": 3700, "requests": {"cpu": 40000, "memory": 2 << 30},
                 "weight": 1.0, "fair_share": 0.5, "adjusted_fair_share": 0.5,
                 "actual_share": 0.125, "cordoned": False, "queue_defined": True,
                 "queue_limits": {}, "queue_allocation": {"cpu": 8000},
                 "cluster_nodes": 4, "cluster_free": {"cpu": 56000},
                 "largest_free_node": {"cpu": 16000}, "largest_node": {"cpu": 16000},
                 "max_queued_seconds": None, "max_queued_action": None,
                 "competing_queues": [], "message": 'queue "a", position 2 of 5; fits no node'}}


def test_explain_prints_the_reason_with_its_numbers_in_human_units() -> None:
    text, client = run(["explain", "c/n/p"], EXPLAINED)
    assert client.requests == [("GET", "/api/v1/explain/c/n/p", None)]
    lines = dict(line.split(":", 1) for line in text.splitlines())
    assert lines["Waiting for"].strip() == "node_fit"
    assert lines["Position"].strip() == "2 of 5"
    assert lines["Waited"].strip() == "1h1m"
    assert lines["Requests"].strip() == "cpu 40, memory 2Gi"
    assert lines["Largest node"].strip() == "cpu 16"
    assert lines["Actual share"].strip() == "12.5%"


def test_explain_says_how_to_name_a_pod() -> None:
    args = cli.build_parser().parse_args(["explain", "just-a-pod"])
    with pytest.raises(argparse.ArgumentTypeError, match="CLUSTER/NAMESPACE/POD"):
        cli_views.explain(Recorded(None), args, io.StringIO())


def test_jobset_list_and_describe_count_pods_by_phase() -> None:
    summary = {"queue": "a", "jobset": "run-1", "clusters": ["c1", "c2"], "namespaces": ["n"],
               "pods": 6, "unfinished": 4,
               "by_state": {"queued": 2, "running": 1, "ungated": 1, "succeeded": 2},
               "oldest_queued_at": None, "first_created_at": "2026-01-01T00:00:00+00:00",
               "last_changed_at": "2026-01-01T00:00:00+00:00"}
    text, client = run(["jobset", "list", "--queue", "a"], {"jobsets": [summary]})
    assert client.requests[0][2] == {"limit": "1000", "queue": "a"}
    assert text.splitlines()[1].split()[:7] == ["a", "run-1", "6", "2", "2", "2", "c1,c2"]
    described, _ = run(["jobset", "describe", "a", "run-1"],
                       {**summary, "jobs_shown": 0, "jobs": []})
    assert "Job set run-1 in queue a: 6 pods" in described


def test_every_command_takes_every_output_format() -> None:
    parser = cli.build_parser()
    commands = [["queue", "create", "q"], ["queue", "update", "q", "--cordon"],
                ["queue", "cordon", "q"], ["queue", "uncordon", "q"], ["queue", "delete", "q"],
                ["queue", "get", "q"], ["queue", "list"], ["jobs", "list"], ["token", "new", "x"],
                ["status"], ["explain", "c/n/p"], ["jobset", "list"],
                ["jobset", "describe", "q", "j"]]
    for command in commands:
        for output in ("table", "json", "yaml"):
            assert parser.parse_args([*command, "-o", output]).output == output, command


def test_a_queue_is_created_with_a_maximum_time_queued() -> None:
    queue = {"name": "q", "priority_factor": 1.0, "weight": 1.0, "cordoned": False,
             "resource_limits": {}, "namespaces": [],
             "max_queued": {"seconds": 1800, "action": "delete"}}
    text, client = run(["queue", "create", "q", "--max-queued-time", "30m", "--on-max-queued",
                        "delete"], queue)
    assert client.requests[0][:2] == ("POST", "/api/v1/queues")
    assert client.bodies[0]["max_queued"] == {"seconds": 1800, "action": "delete"}
    assert "30m,delete" in text


def test_two_modules_share_a_noun() -> None:
    nouns = argparse.ArgumentParser().add_subparsers(dest="noun")
    assert verbs_of(nouns, "jobset", "h") is verbs_of(nouns, "jobset", "h")
