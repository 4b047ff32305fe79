"""`lockgate namespace ...` and `--allow-kind` arguments, without a server."""

from __future__ import annotations

import io

import pytest

from lockgate_adapters import cli


def test_namespace_create_takes_a_human_ttl() -> None:
    args = cli.build_parser().parse_args(
        ["namespace", "create", "--queue", "q", "--jobset", "j", "--cluster", "c", "--ttl", "2h",
         "-o", "yaml"])
    assert (args.queue, args.jobset, args.cluster, args.ttl, args.output) == (
        "q", "j", "c", 7200, "yaml")


def test_a_bad_ttl_is_a_usage_error_that_says_what_to_write(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["namespace", "create", "--queue", "q", "--jobset", "j",
                                       "--cluster", "c", "--ttl", "two hours"])
    assert exited.value.code == 2
    assert "like 90s, 30m, 2h or 7d" in capsys.readouterr().err


def test_describe_needs_cluster_and_name() -> None:
    err = io.StringIO()
    code = cli.main(["--api", "http://127.0.0.1:9", "namespace", "describe", "just-a-name"],
                    out=io.StringIO(), err=err)
    assert code == 1
    assert "CLUSTER/NAME" in err.getvalue()


def test_queue_create_and_update_take_allowed_kinds() -> None:
    parser = cli.build_parser()
    created = parser.parse_args(["queue", "create", "q", "--allow-kind", "pods",
                                 "--allow-kind", "services"])
    assert created.allow_kind == ["pods", "services"]
    updated = parser.parse_args(["queue", "update", "q", "--disallow-kind", "secrets",
                                 "--default-kinds"])
    assert (updated.disallow_kind, updated.default_kinds) == (["secrets"], True)


class RecordingClient:
    """Stands in for the admin API client: records the request, answers like the API."""

    def __init__(self) -> None:
        self.body: dict[str, object] = {}

    def request(self, method: str, path: str, body: dict[str, object] | None = None,
                **_: object) -> dict[str, object]:
        self.body = dict(body or {})
        record = {"cluster": "c", "name": "n", "state": "active", "queue": "q", "jobset": "j",
                  "service_account": "lockgate-coordinator", "expires_at": None,
                  "max_queued": self.body.get("max_queued")}
        return {"namespace": record, "token": "t", "token_expires_at": None,
                "kubeconfig": {"apiVersion": "v1"}}


def test_namespace_create_sends_the_job_sets_max_queued_time_and_says_it() -> None:
    from lockgate_adapters import cli_namespaces

    args = cli.build_parser().parse_args(
        ["namespace", "create", "--queue", "q", "--jobset", "j", "--cluster", "c",
         "--max-queued-time", "30m", "--on-max-queued", "delete"])
    recording, out = RecordingClient(), io.StringIO()
    cli_namespaces.namespace_create(recording, args, out)  # type: ignore[arg-type]
    assert recording.body["max_queued"] == {"seconds": 1800, "action": "delete"}
    assert "its pods wait at most 30m queued, then are deleted" in out.getvalue()


def test_an_action_without_a_max_queued_time_is_refused_saying_what_to_add() -> None:
    err = io.StringIO()
    code = cli.main(["--api", "http://127.0.0.1:9", "namespace", "create", "--queue", "q",
                     "--jobset", "j", "--cluster", "c", "--on-max-queued", "fail"],
                    out=io.StringIO(), err=err)
    assert code == 1
    assert "--on-max-queued needs --max-queued-time" in err.getvalue()
