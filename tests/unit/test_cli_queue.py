"""`lockgate queue ...` without a server: weight and priority factor, bindings, unknown
clusters, the list's columns and formats, and usage errors that name their command."""

from __future__ import annotations

import io
import json

import click
import httpx
import pytest
from recorded_api import CLUSTERS, RecordedApi, a_queue

from lockgate.queues import NamespaceBinding
from lockgate_cli import root
from lockgate_cli.params import Duration


def created(request_body: dict[str, object]) -> dict[str, object]:
    return a_queue(**{k: v for k, v in request_body.items()
                      if k in ("name", "priority_factor", "namespaces", "cordoned")})


def api() -> RecordedApi:
    return (RecordedApi().on("GET", "/api/v1/clusters", CLUSTERS)
            .on("POST", "/api/v1/queues",
                lambda request: (201, created(json.loads(request.content)))))


@pytest.mark.parametrize(("flags", "factor"), [
    (["--weight", "2"], 0.5), (["--weight", "0.25"], 4.0), (["--priority-factor", "0.5"], 0.5),
    ([], None)])
def test_weight_is_sent_as_its_inverse_the_priority_factor(
        flags: list[str], factor: float | None) -> None:
    ran = api().run("queue", "create", "q", *flags)
    assert ran.code == 0, ran.err
    (body,) = [s.body for s in ran.sent if s.method == "POST"]
    assert body.get("priority_factor") == factor
    header, row = ran.out.splitlines()
    assert header.split()[:4] == ["NAME", "PATH", "WEIGHT", "PRIORITY-FACTOR"]
    expected_weight = "1" if factor is None else f"{1 / factor:.3g}"
    assert row.split()[:3] == ["q", "q", expected_weight]


def test_weight_and_priority_factor_are_exclusive_and_positive() -> None:
    both = api().run("queue", "create", "q", "--weight", "2", "--priority-factor", "0.5")
    assert both.code == 2
    assert "lockgate queue create: give --weight or --priority-factor, not both" in both.err
    for flag in ("--weight", "--priority-factor"):
        zero = api().run("queue", "create", "q", flag, "0")
        assert zero.code == 2 and f"'{flag}'" in zero.err, zero.err
    assert not [s for s in both.sent if s.method == "POST"]


def test_update_takes_weight_too() -> None:
    recorded = RecordedApi().on("PATCH", "/api/v1/queues/q",
                                lambda request: a_queue(priority_factor=1 / 3))
    ran = recorded.run("queue", "update", "q", "--weight", "3", "-o", "json")
    assert ran.code == 0, ran.err
    assert recorded.bodies("PATCH") == [{"priority_factor": 1 / 3}]
    assert json.loads(ran.out)["weight"] == pytest.approx(3)


def test_bindings_by_name_per_cluster_and_by_selector_are_what_the_api_takes() -> None:
    ran = api().run("queue", "create", "q", "--namespace", "team-a",
                    "--namespace", "cluster-b/team-b", "--namespace", "team-c",
                    "--namespace-selector", "cluster-a:lockgate.io/team=ml,tier=gpu")
    assert ran.code == 0, ran.err
    (body,) = [s.body for s in ran.sent if s.method == "POST"]
    assert body["namespaces"] == [
        {"cluster": "*", "names": ["team-a", "team-c"]},
        {"cluster": "cluster-b", "names": ["team-b"]},
        {"cluster": "cluster-a", "selector": {"matchLabels": {"lockgate.io/team": "ml",
                                                              "tier": "gpu"}}},
    ]
    for binding in body["namespaces"]:
        NamespaceBinding.model_validate(binding)


@pytest.mark.parametrize("flags", [
    ["--namespace", "cluster-z/foo"], ["--namespace-selector", "cluster-z:team=a"],
    ["--namespaces-json", '[{"cluster": "cluster-z", "names": ["foo"]}]']])
def test_an_unknown_cluster_is_refused_with_the_known_ones(flags: list[str]) -> None:
    ran = api().run("queue", "create", "q", *flags)
    assert ran.code == 1
    assert "lockgate queue create: unknown cluster 'cluster-z'" in ran.err
    assert "lockgate knows cluster-a, cluster-b" in ran.err
    assert not [s for s in ran.sent if s.method == "POST"], "nothing was created"


def test_a_cluster_cannot_be_checked_before_any_watcher_reported_so_it_warns() -> None:
    recorded = api().on("GET", "/api/v1/clusters", {"clusters": []})
    ran = recorded.run("queue", "create", "q", "--namespace", "cluster-z/foo")
    assert ran.code == 0, ran.err
    assert "warning: lockgate knows no cluster yet" in ran.err


def test_list_shows_weight_and_factor_wide_adds_columns_and_name_and_jsonpath_work() -> None:
    queues = {"queues": [a_queue("a", priority_factor=0.5, group_timeout_seconds=300),
                         a_queue("b", cordoned=True, resource_limits={"cpu": "10"},
                                 namespaces=[{"cluster": "*", "names": ["team-b"]}])]}
    recorded = RecordedApi().on("GET", "/api/v1/queues", queues)
    table = recorded.run("queue", "list")
    header, a, b = table.out.splitlines()
    assert header.split() == ["NAME", "PATH", "WEIGHT", "PRIORITY-FACTOR", "CORDONED",
                              "LIMITS", "GUARANTEE", "MAX-QUEUED", "NAMESPACES", "ALLOWED-KINDS"]
    assert a.split()[:5] == ["a", "a", "2", "0.5", "no"]
    assert b.split() == ["b", "b", "1", "1", "yes", "cpu=10", "-", "-", "*/team-b",
                         "(default)"]
    wide = recorded.run("queue", "list", "-o", "wide").out.splitlines()
    assert wide[0].split()[-2:] == ["GROUP-TIMEOUT", "CREATED"]
    assert wide[1].split()[-2:] == ["5m,delete", "2026-12-01T10:00:00"]
    assert recorded.run("queue", "list", "-o", "name").out == "queue/a\nqueue/b\n"
    assert recorded.run("queue", "list", "-o",
                        "jsonpath={[*].name}").out == "a b\n"
    cordoned = recorded.run("queue", "list", "-o",
                            'jsonpath={range [?(@.cordoned == true)]}{.name}{"\\n"}{end}')
    assert cordoned.out == "b\n"


def test_a_queue_is_created_with_a_maximum_time_queued() -> None:
    recorded = RecordedApi().on("POST", "/api/v1/queues", (201, a_queue(
        max_queued={"seconds": 1800, "action": "delete"})))
    ran = recorded.run("queue", "create", "q", "--max-queued-time", "30m", "--on-max-queued",
                       "delete")
    assert recorded.bodies("POST")[0]["max_queued"] == {"seconds": 1800, "action": "delete"}
    assert "30m,delete" in ran.out
    lone = RecordedApi().run("queue", "create", "q", "--on-max-queued", "fail")
    assert lone.code == 2 and "--on-max-queued needs --max-queued-time" in lone.err


def test_usage_errors_name_their_command_and_never_argparse_words() -> None:
    for argv, command, message in (
            (["queue", "update", "q"], "lockgate queue update", "nothing to update"),
            (["queue", "create"], "lockgate queue create", "Missing argument 'NAME'"),
            (["queue", "create", "q", "--wieght", "2"], "lockgate queue create",
             "Did you mean '--weight'?"),
            (["queue", "crate", "q"], "lockgate queue", "No such command 'crate'"),
            (["queue", "create", "q", "--limit", "cpu"], "lockgate queue create",
             "RESOURCE=QUANTITY"),
            (["queue", "list", "-o", "xml"], "lockgate queue list", "'xml' is not one of"),
            (["queue", "list", "-o", "jsonpath={.a"], "lockgate queue list", "unclosed {"),
            (["explain", "just-a-pod"], "lockgate explain", "CLUSTER/NAMESPACE/POD")):
        ran = RecordedApi().run(*argv)
        assert ran.code == 2, (argv, ran.err)
        first = ran.err.splitlines()[0]
        assert first.startswith(f"{command}: ") and message in first, (argv, ran.err)
        assert f"See '{command} --help'." in ran.err
        assert "noun" not in ran.err and "verb" not in ran.err


def test_api_errors_name_their_command_and_exit_1() -> None:
    recorded = RecordedApi().on("POST", "/api/v1/queues",
                                (409, {"error": "queue 'q' already exists"}))
    ran = recorded.run("queue", "create", "q")
    assert (ran.code, ran.err) == (
        1, "lockgate queue create: queue 'q' already exists (HTTP 409)\n")


def test_global_options_may_come_after_the_command() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/queues", {"queues": []})
    ran = recorded.run("queue", "list", "--api", "http://elsewhere.test", "-o", "json")
    assert ran.code == 0, ran.err
    assert json.loads(ran.out) == []
    assert [s.host for s in ran.sent] == ["elsewhere.test"]


def test_an_unreachable_api_is_a_message_naming_the_command_and_where_to_set_the_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    err = io.StringIO()
    code = root.main(["--api", "http://127.0.0.1:9", "queue", "list"], out=io.StringIO(),
                     err=err, transport=httpx.MockTransport(refuse), env={})
    assert code == 1
    assert err.getvalue().startswith("lockgate queue list: cannot reach the lockgate API at "
                                     "http://127.0.0.1:9: [Errno 111] Connection refused (is "
                                     "queue-store running? set --api, LOCKGATE_API")


# ---- allowed kinds: --allow-kind adds to the default list, --only-kind replaces it

DEFAULTS = ["pods", "services", "configmaps", "deployments.apps", "statefulsets.apps",
            "jobs.batch"]
DASK = "daskworkergroups.kubernetes.dask.org"


def test_the_cli_knows_the_same_default_kinds_as_the_api() -> None:
    from lockgate.queues import QueueSpec

    assert list(QueueSpec(name="q").effective_allowed_kinds) == DEFAULTS


@pytest.mark.parametrize(("flags", "sent"), [
    ([], None),  # the default list, followed as it is
    (["--allow-kind", "secrets", "--allow-kind", DASK], [*DEFAULTS, "secrets", DASK]),
    (["--allow-kind", "pods"], None),  # already a default: still the default list
    (["--allow-kind", " secrets ", "--allow-kind", "secrets"], [*DEFAULTS, "secrets"]),
    (["--only-kind", "pods", "--only-kind", DASK], ["pods", DASK]),
])
def test_create_adds_allowed_kinds_to_the_default_ones_or_replaces_them(
        flags: list[str], sent: list[str] | None) -> None:
    ran = api().run("queue", "create", "q", *flags)
    assert ran.code == 0, ran.err
    (body,) = [s.body for s in ran.sent if s.method == "POST"]
    assert body.get("allowed_kinds") == sent


def queue_allowing(kinds: list[str] | None) -> RecordedApi:
    """A queue `q` allowing `kinds` (None: the default list), answering PATCH with itself."""
    current = a_queue(allowed_kinds=DEFAULTS if kinds is None else kinds,
                      allowed_kinds_default=kinds is None)
    return (RecordedApi().on("GET", "/api/v1/queues/q", current)
            .on("PATCH", "/api/v1/queues/q", lambda request: current))


@pytest.mark.parametrize(("current", "flags", "sent"), [
    (None, ["--allow-kind", DASK], [*DEFAULTS, DASK]),
    (["pods"], ["--allow-kind", DASK], ["pods", DASK]),
    ([*DEFAULTS, "secrets"], ["--disallow-kind", "secrets"], None),  # the default again
    (None, ["--disallow-kind", "jobs.batch"], DEFAULTS[:-1]),
    (["pods", "secrets"], ["--only-kind", "pods", "--only-kind", DASK], ["pods", DASK]),
    (["pods"], ["--default-kinds"], None),
    (["pods"], ["--default-kinds", "--allow-kind", "secrets"], [*DEFAULTS, "secrets"]),
])
def test_update_adds_removes_or_replaces_allowed_kinds(
        current: list[str] | None, flags: list[str], sent: list[str] | None) -> None:
    recorded = queue_allowing(current)
    ran = recorded.run("queue", "update", "q", *flags)
    assert ran.code == 0, ran.err
    assert recorded.bodies("PATCH") == [{"allowed_kinds": sent}]


@pytest.mark.parametrize(("argv", "says"), [
    (["create", "q", "--allow-kind", "secrets", "--only-kind", "pods"],
     "lockgate queue create: give --allow-kind (adds to the default kinds) or --only-kind "
     "(replaces them), not both"),
    (["update", "q", "--only-kind", "pods", "--allow-kind", "secrets"],
     "lockgate queue update: --only-kind replaces the list: give it alone"),
    (["update", "q", "--only-kind", "pods", "--default-kinds"], "give it alone"),
    (["create", "q", "--allow-kind", "pods/exec"],
     "Invalid value for '--allow-kind': kind 'pods/exec' is not a lower-case plural resource"),
    (["update", "q", "--only-kind", "Pods"], "Invalid value for '--only-kind'"),
    (["create", "q", "--allow-kind", "namespaces"], "cannot be allowed: it is cluster-scoped"),
])
def test_bad_kind_flags_are_usage_errors_and_nothing_is_sent(argv: list[str], says: str) -> None:
    recorded = queue_allowing(None).on("POST", "/api/v1/queues", a_queue())
    ran = recorded.run("queue", *argv)
    assert ran.code == 2 and says in ran.err, ran.err
    assert not [s for s in ran.sent if s.method in ("POST", "PATCH")]


def test_help_says_allow_kind_adds_and_only_kind_replaces(
        capsys: pytest.CaptureFixture[str]) -> None:
    ran = RecordedApi().run("queue", "create", "--help")
    assert ran.code == 0
    text = " ".join((ran.out + capsys.readouterr().out).split())
    assert "besides the default ones (pods, services, configmaps," in text
    assert "--only-kind KIND allow only the kinds given this way, instead of the default" in text


def test_create_and_update_say_on_stderr_which_bound_namespaces_the_webhook_will_not_serve(
        ) -> None:
    warning = ("lockgate's webhook does not serve namespace cluster-a/jhub: it serves only "
               "namespaces labelled lockgate.io/managed=true lockgate.io/run=dev, and this one "
               "lacks lockgate.io/run=dev")
    recorded = (api().on("POST", "/api/v1/queues",
                         lambda request: (201, {**created(json.loads(request.content)),
                                                "warnings": [warning]}))
                .on("PATCH", "/api/v1/queues/q", {**a_queue(), "warnings": [warning]}))
    for argv in (["queue", "create", "q", "--namespace", "cluster-a/jhub", "-o", "json"],
                 ["queue", "update", "q", "--weight", "2", "-o", "json"]):
        ran = recorded.run(*argv)
        assert ran.code == 0, ran.err
        assert ran.err.splitlines() == [f"warning: {warning}"]
        assert "warnings" not in json.loads(ran.out)  # the queue itself, as GET shows it


@pytest.mark.parametrize(("spelled", "seconds"), [("20s", 20), ("5m", 300), ("2h", 7200),
                                                  ("45", 45)])
def test_group_timeout_takes_a_duration_like_every_duration_flag(spelled: str,
                                                                 seconds: float) -> None:
    """Issue 38: `--group-timeout 20s` answered "'20s' is not a valid float range"."""
    recorded = RecordedApi().on("PATCH", "/api/v1/queues/big", lambda request: a_queue(
        name="big", group_timeout_seconds=json.loads(request.content)["group_timeout_seconds"]))
    ran = recorded.run("queue", "update", "big", "--group-timeout", spelled)
    assert ran.code == 0, ran.err
    assert recorded.bodies("PATCH") == [{"group_timeout_seconds": seconds}]


def test_a_bad_duration_flag_says_how_to_write_one_and_sends_nothing() -> None:
    ran = RecordedApi().run("queue", "update", "big", "--group-timeout", "20x")
    assert ran.code == 2
    assert ("Invalid value for '--group-timeout': not a duration: '20x' (write e.g. 20s, 5m, "
            "2h, 1d, 1h30m, or bare seconds)") in ran.err, ran.err
    assert not ran.sent


def _options(command: click.Command, path: str = "lockgate") -> list[tuple[str, click.Option]]:
    found = [(path, p) for p in command.params if isinstance(p, click.Option)]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            found += _options(sub, f"{path} {name}")
    return found


def test_every_flag_that_takes_a_time_takes_the_one_duration_grammar() -> None:
    timed = [(path, option) for path, option in _options(root.cli)
             if any(word in option.name for word in ("wait", "ttl", "interval", "timeout",
                                                     "time", "age", "seconds"))
             and not option.is_flag and not isinstance(option.type, click.Choice)]
    assert {option.name for _, option in timed} >= {
        "wait", "ttl", "interval", "group_timeout", "max_queued_time"}
    wrong = [f"{path} --{option.name}" for path, option in timed
             if not isinstance(option.type, Duration)]
    assert not wrong, wrong


def test_the_tree_options_send_parent_and_guarantee_and_list_shows_paths() -> None:
    recorded = api()
    ran = recorded.run("queue", "create", "production", "--weight", "2", "--guarantee",
                       "cpu=32", "--limit", "cpu=64")
    assert ran.code == 0, ran.err
    ran = recorded.run("queue", "create", "alice", "--parent", "vision")
    assert ran.code == 0, ran.err
    first, second = recorded.bodies("POST")
    assert first["guarantee"] == {"cpu": "32"} and first["resource_limits"] == {"cpu": "64"}
    assert "parent" not in first
    assert second["parent"] == "vision" and "guarantee" not in second
    listed = RecordedApi().on("GET", "/api/v1/queues", {"queues": [
        a_queue("alice", parent="vision"), a_queue("research"),
        a_queue("vision", parent="research"),
        a_queue("production", guarantee={"cpu": "32"})]})
    lines = listed.run("queue", "list").out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [
        ["production", "production"], ["research", "research"],
        ["vision", "research/vision"], ["alice", "research/vision/alice"]]
    assert lines[1].split()[6] == "cpu=32"


def test_update_moves_a_queue_and_changes_guarantees() -> None:
    recorded = RecordedApi().on("PATCH", "/api/v1/queues/alice",
                                lambda request: (200, a_queue("alice")))
    assert recorded.run("queue", "update", "alice", "--root", "--guarantee", "cpu=8",
                        "--remove-guarantee", "memory").code == 0
    assert recorded.run("queue", "update", "alice", "--parent", "nlp").code == 0
    assert recorded.bodies("PATCH") == [
        {"parent": None, "guarantee": {"cpu": "8", "memory": None}}, {"parent": "nlp"}]
    both = recorded.run("queue", "update", "alice", "--root", "--parent", "nlp")
    assert both.code == 2 and "--parent QUEUE or --root, not both" in both.err
