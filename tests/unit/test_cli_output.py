"""How answers print: aligned tables with human units, -o wide|name|json|yaml|jsonpath, the
views of status, explain and job sets, --watch, and a closed pipe. The API is a recording."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from recorded_api import CLUSTERS, RecordedApi

from lockgate_cli import root
from lockgate_cli.jsonpath import TemplateError, check_template, render_template
from lockgate_cli.output import Output, Table, View, print_table, render
from lockgate_cli.watching import show


def rendered(output: str, data: Any, table: Any = None) -> str:
    out = io.StringIO()
    kind, _, template = output.partition("=")
    render(out, Output(kind, template), View(data, table=table))
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


def test_an_empty_table_says_what_to_do_notes_follow_and_wide_columns_hide() -> None:
    assert rendered("table", [], lambda: Table(["A"], [], empty="nothing: do X")) \
        == "nothing: do X\n"
    assert rendered("table", [], lambda: Table(["A"], [["1"]], notes=["n"])) == "A\n1\nnote: n\n"
    table = lambda: Table(["A", "B", "C"], [["1", "2", "3"]], wide=1)  # noqa: E731
    assert rendered("table", [], table).splitlines()[0].split() == ["A", "B"]
    assert rendered("wide", [], table).splitlines()[0].split() == ["A", "B", "C"]


def test_a_mapping_without_a_table_reads_as_aligned_fields() -> None:
    assert rendered("table", {"Queue": "a", "Cordoned": True, "Limits": None}).splitlines() == [
        "Queue:     a", "Cordoned:  yes", "Limits:    -"]


STATUS = {"at": "2026-01-01T00:00:00+00:00", "queues": [
    {"queue": "team-a", "defined": True, "cordoned": False, "weight": 2.0, "fair_share": 2 / 3,
     "adjusted_fair_share": 0.75, "actual_share": 0.5, "queued": 12, "unschedulable": 1,
     "released": 2, "running": 30, "oldest_queued_at": "2025-12-31T23:56:48+00:00",
     "oldest_wait_seconds": 192,
     "max_queued_seconds": 3600, "fair_target": 0.625,
     "cluster_targets": {"cluster-a": 0.625}, "cluster_shares": {"cluster-a": 0.5}},
    {"queue": "b", "defined": True, "cordoned": True, "weight": 1.0, "fair_share": 1 / 3,
     "adjusted_fair_share": 0.25, "actual_share": 0.0, "queued": 0, "unschedulable": 0,
     "released": 0, "running": 0, "oldest_queued_at": None, "oldest_wait_seconds": None,
     "max_queued_seconds": None}]}


def test_status_shows_shares_as_percentages_and_the_oldest_wait_as_a_duration() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/status", STATUS)
    ran = recorded.run("status")
    assert [(s.method, s.path) for s in ran.sent] == [("GET", "/api/v1/status")]
    # The table shows no cluster's figures, so it does not ask for them (queues x clusters).
    assert ran.sent[0].query == {}
    header, team_a, b = ran.out.splitlines()
    assert header.split() == ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED", "ACTUAL", "TARGET",
                              "QUEUED", "RELEASED", "RUNNING", "OLDEST-WAIT", "NOTE"]
    assert team_a.split()[:10] == ["team-a", "2", "66.7%", "75.0%", "50.0%", "62.5%", "12",
                                   "2", "30", "3m12s"]
    assert "1 fit no node" in team_a and "max queued 1h" in team_a
    assert b.split()[5] == "-" and b.split()[9:] == ["-", "cordoned"]
    as_yaml = recorded.run("status", "-o", "yaml")
    assert yaml.safe_load(as_yaml.out) == STATUS
    # The structured outputs' contract carries each queue's per-cluster figures: asked for.
    assert as_yaml.sent[-1].query == {"clusters": "1"}
    assert recorded.run("status", "-o", "name").out == "queue/team-a\nqueue/b\n"
    assert recorded.run("status", "-o", "jsonpath={.queues[0].queued}").out == "12\n"


def test_status_wide_adds_each_clusters_share_of_the_target_and_the_schedulers_figures(
        ) -> None:
    report = {"leader": True, "queues": [
        {"name": "team-a", "demand_share": 0.9, "released_last_round": 3},
        {"name": "b", "demand_share": 0.1, "released_last_round": 0}]}
    recorded = (RecordedApi().on("GET", "/api/v1/status", STATUS)
                .on("GET", "/api/v1/fairness", report))
    wide = recorded.run("status", "-o", "wide")
    header, team_a, b = wide.out.splitlines()
    assert wide.sent[0].path == "/api/v1/status" and wide.sent[0].query == {"clusters": "1"}
    assert header.split()[-5:] == ["BY-CLUSTER", "DEMAND", "RELEASED-LAST-ROUND",
                                   "DECAYED-USAGE", "EFF-WEIGHT"]
    # Usage history off: its two columns say "-".
    assert team_a.split()[-5:] == ["cluster-a:50.0%/62.5%", "90.0%", "3", "-", "-"]
    assert b.split()[-5:] == ["-", "10.0%", "0", "-", "-"]
    # An API without the scheduler's report (older, or no leader): those columns say "-".
    older = RecordedApi().on("GET", "/api/v1/status", STATUS).run("status", "-o", "wide")
    assert older.code == 0, older.err
    assert older.out.splitlines()[1].split()[-4:] == ["-", "-", "-", "-"]


GROWTH = [
    {"cluster": "cluster-c", "nodes": 2, "capacity": {"cpu": 16000, "memory": 32 << 30},
     "node_pools": [
         {"name": "default", "headroom_nodes": 6, "headroom": {"cpu": 48000},
          "node_shape": {"cpu": 8000}, "node_shape_from": "its requirements", "why_none": ""},
         {"name": "gpu", "headroom_nodes": 0, "headroom": {}, "node_shape": None,
          "node_shape_from": "", "why_none": "NodePool gpu is not Ready (NodeClassNotReady)"}],
     "claims_in_flight": ["default-x7k2p"], "released_unbound": 3,
     "stalled": "growth stalled: NodeClaim default-x7k2p: InsufficientCapacity: none left",
     "waiting": ""}]


def test_status_wide_shows_each_growing_clusters_nodes_capacity_headroom_and_stall() -> None:
    recorded = (RecordedApi().on("GET", "/api/v1/status", STATUS | {"growth": GROWTH})
                .on("GET", "/api/v1/fairness", {"leader": True, "queues": []}))
    lines = recorded.run("status", "-o", "wide").out.splitlines()
    section = lines[lines.index("CLUSTERS THAT GROW") + 1:]
    assert section[0].split() == ["CLUSTER", "NODES", "CAPACITY", "HEADROOM",
                                  "NODECLAIMS-IN-FLIGHT", "RELEASED-UNBOUND", "GROWTH"]
    row = section[1]
    assert row.split()[:2] == ["cluster-c", "2"]
    assert "cpu 16, memory 32Gi" in row
    assert ("default: 6 nodes (cpu 48); gpu: none (NodePool gpu is not Ready "
            "(NodeClassNotReady))") in row
    assert "default-x7k2p" in row and "  3  " in row
    assert row.endswith("growth stalled: NodeClaim default-x7k2p: InsufficientCapacity: "
                        "none left")
    # Without -o wide, or with no cluster that grows, there is no such section.
    assert "CLUSTERS THAT GROW" not in recorded.run("status").out
    plain = (RecordedApi().on("GET", "/api/v1/status", STATUS)
             .on("GET", "/api/v1/fairness", {"leader": True, "queues": []}))
    assert "CLUSTERS THAT GROW" not in plain.run("status", "-o", "wide").out


EXPLAINED = {"pod": {"cluster": "cluster-a", "namespace": "n", "name": "p", "uid": "u",
                     "jobset": "j", "state": "queued", "last_reason": ""},
             "message": 'queue "a", position 2 of 5; fits no node', "explanation": {
                 "job_id": "c/u", "cluster": "cluster-a", "queue": "a", "state": "queued",
                 "reason": "node_fit", "position": 2, "queued_in_queue": 5,
                 "waited_seconds": 3700, "requests": {"cpu": 40000, "memory": 2 << 30},
                 "weight": 1.0, "fair_share": 0.5, "adjusted_fair_share": 0.5,
                 "actual_share": 0.125, "cordoned": False, "queue_defined": True,
                 "queue_limits": {}, "queue_allocation": {"cpu": 8000},
                 "cluster_nodes": 4, "cluster_free": {"cpu": 56000},
                 "largest_free_node": {"cpu": 16000}, "largest_node": {"cpu": 16000},
                 "max_queued_seconds": None, "max_queued_action": None,
                 "competing_queues": [], "message": 'queue "a", position 2 of 5; fits no node'}}


def test_explain_says_a_release_for_growth_in_its_words() -> None:
    words = ("released so that cluster-c grows (NodePool default: headroom cpu=48); waiting "
             "for a node (NodeClaim default-x7k2p)")
    released = {**EXPLAINED, "pod": {**EXPLAINED["pod"], "state": "ungated"},
                "message": f"queue a; {words}",
                "explanation": {**EXPLAINED["explanation"], "state": "ungated", "reason": None,
                                "position": 0, "growth_standing": "released_for_growth",
                                "growth": words, "message": f"queue a; {words}"}}
    ran = RecordedApi().on("GET", "/api/v1/explain/cluster-a/n/p", released).run(
        "explain", "cluster-a/n/p")
    lines = dict(line.split(":", 1) for line in ran.out.splitlines())
    assert lines["Growth"].strip() == words
    assert lines["Waiting for"].strip() == "-" and lines["State"].strip() == "ungated"


def test_explain_prints_the_reason_with_its_numbers_in_human_units() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/explain/cluster-a/n/p", EXPLAINED)
    ran = recorded.run("explain", "cluster-a/n/p")
    lines = dict(line.split(":", 1) for line in ran.out.splitlines())
    assert lines["Waiting for"].strip() == "node_fit"
    assert lines["Position"].strip() == "2 of 5"
    assert lines["Waited"].strip() == "1h1m"
    assert lines["Requests"].strip() == "cpu 40, memory 2Gi"
    assert lines["Largest node"].strip() == "cpu 16"
    assert lines["Actual share"].strip() == "12.5%"


def test_explain_of_an_unknown_cluster_says_which_clusters_there_are() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/clusters", CLUSTERS)
    ran = recorded.run("explain", "cluster-z/n/p")
    assert ran.code == 1
    assert ran.err == ("lockgate explain: unknown cluster 'cluster-z' in CLUSTER/NAMESPACE/POD; "
                       "lockgate knows cluster-a, cluster-b (see 'lockgate cluster list')\n")


def test_jobset_list_and_describe_count_pods_by_phase() -> None:
    summary = {"queue": "a", "jobset": "run-1", "clusters": ["c1", "c2"], "namespaces": ["n"],
               "pods": 6, "unfinished": 4,
               "by_state": {"queued": 2, "running": 1, "ungated": 1, "succeeded": 2},
               "oldest_queued_at": None, "first_created_at": "2026-01-01T00:00:00+00:00",
               "last_changed_at": "2026-01-01T00:00:00+00:00"}
    recorded = (RecordedApi().on("GET", "/api/v1/jobsets", {"jobsets": [summary]})
                .on("GET", "/api/v1/jobsets/a/run-1", {**summary, "jobs_shown": 0, "jobs": []}))
    ran = recorded.run("jobset", "list", "--queue", "a")
    assert ran.sent[0].query == {"limit": "1000", "queue": "a"}
    assert ran.out.splitlines()[1].split()[:7] == ["a", "run-1", "6", "2", "2", "2", "c1,c2"]
    assert recorded.run("jobset", "list", "-o", "name").out == "jobset/a/run-1\n"
    described = recorded.run("jobset", "describe", "a", "run-1")
    assert "Job set run-1 in queue a: 6 pods" in described.out


@pytest.mark.parametrize("output", ["table", "wide", "name", "json", "yaml",
                                    "jsonpath={.name}"])
def test_every_command_takes_every_output_format(output: str) -> None:
    queue = {"name": "q", "priority_factor": 1.0, "weight": 1.0, "cordoned": False,
             "resource_limits": {}, "namespaces": []}
    jobs = {"jobs": [], "hints": []}
    recorded = (RecordedApi().on("POST", "/api/v1/queues", (201, queue))
                .on("PATCH", "/api/v1/queues/q", queue).on("GET", "/api/v1/queues/q", queue)
                .on("DELETE", "/api/v1/queues/q", (204, None))
                .on("GET", "/api/v1/queues", {"queues": [queue]})
                .on("GET", "/api/v1/jobs", jobs).on("GET", "/api/v1/status", STATUS)
                .on("GET", "/api/v1/explain/cluster-a/n/p", EXPLAINED)
                .on("GET", "/api/v1/jobsets", {"jobsets": []})
                .on("GET", "/api/v1/clusters", CLUSTERS)
                .on("GET", "/api/v1/namespaces", {"namespaces": []}))
    for command in (["queue", "create", "q"], ["queue", "update", "q", "--cordon"],
                    ["queue", "cordon", "q"], ["queue", "uncordon", "q"],
                    ["queue", "delete", "q"], ["queue", "get", "q"], ["queue", "list"],
                    ["jobs", "list"], ["token", "new", "x"], ["status"],
                    ["explain", "cluster-a/n/p"], ["jobset", "list"], ["cluster", "list"],
                    ["namespace", "list"]):
        ran = recorded.run(*command, "-o", output)
        assert ran.code == 0, (command, output, ran.err)


@pytest.mark.parametrize(("template", "data", "want"), [
    ("{.a.b}", {"a": {"b": "x"}}, "x"),
    ("{.items[*].name}", {"items": [{"name": "a"}, {"name": "b"}]}, "a b"),
    ('{range .items[*]}{.name}{"\\t"}{.n}{"\\n"}{end}', {"items": [{"name": "a", "n": 1},
                                                                  {"name": "b", "n": 2}]},
     "a\t1\nb\t2\n"),
    ("name={.name} on={.on}", {"name": "q", "on": True}, "name=q on=true"),
    ("{.missing}", {"name": "q"}, ""),
    ("{.m}", {"m": {"cpu": 2}}, '{"cpu":2}'),
    ('{.items[?(@.n > 1)].name}', {"items": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]},
     "b"),
    ("{$.a}", {"a": 3}, "3"),
])
def test_jsonpath_templates_read_as_kubectls(template: str, data: Any, want: str) -> None:
    assert render_template(template, data) == want


@pytest.mark.parametrize("template", ["{.a", "{range .a}{.b}", "{end}", '{"x}', "{.a[}"])
def test_a_bad_template_is_refused_with_what_is_wrong(template: str) -> None:
    with pytest.raises(TemplateError):
        check_template(template)


def queue_rows(*rows: list[str]) -> View:
    return View({"rows": [list(r) for r in rows]},
                table=lambda: Table(["NAME", "QUEUED", "AGE"], [list(r) for r in rows],
                                    empty="none yet"),
                names=lambda: [f"queue/{r[0]}" for r in rows])


def test_watch_prints_the_table_then_only_new_or_changed_rows_in_its_columns() -> None:
    answers = iter([
        queue_rows(),
        queue_rows(["a", "1", "1s"]),
        queue_rows(["a", "1", "3s"]),  # only the age moved: not a change
        queue_rows(["a", "2", "5s"], ["longer-b", "10", "5s"]),
    ])
    out = io.StringIO()
    show(out, Output("table"), lambda: next(answers), watch=True, interval=0, polls=4,
         sleep=lambda _: None)
    assert out.getvalue().splitlines() == [
        "none yet",
        "NAME  QUEUED  AGE",
        "a          1   1s",
        # A longer name widens its column from there on (the header is not printed again).
        "a              2   5s",
        "longer-b      10   5s",
    ]


def test_watch_in_json_prints_each_changed_answer_and_ends_quietly_on_ctrl_c() -> None:
    answers = [queue_rows(["a", "1", "1s"]), queue_rows(["a", "1", "2s"]),
               queue_rows(["a", "2", "3s"])]

    def fetch() -> View:
        if not answers:
            raise KeyboardInterrupt
        return answers.pop(0)

    out = io.StringIO()
    show(out, Output("json"), fetch, watch=True, interval=0, sleep=lambda _: None)
    documents = [json.loads(d) for d in out.getvalue().replace("}\n{", "}\x00{").split("\x00")]
    assert [d["rows"][0][1] for d in documents] == ["1", "2"]
    names = io.StringIO()
    rows = iter([queue_rows(["a", "1", "1s"]), queue_rows(["a", "1", "1s"], ["b", "1", "1s"])])
    show(names, Output("name"), lambda: next(rows), watch=True, interval=0, polls=2,
         sleep=lambda _: None)
    assert names.getvalue() == "queue/a\nqueue/b\n"


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly_with_sigpipes_status() -> None:
    err = io.StringIO()
    code = root.main(["token", "new", "x", "-o", "yaml"], out=ClosedPipe(), err=err, env={})
    assert (code, err.getvalue()) == (141, "")
