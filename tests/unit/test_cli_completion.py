"""Shell completion (bash, zsh, fish, and kubectl's plugin completion) and the kubectl plugin's
name in usage, in-process (the installed scripts: tests/integration/test_cli_installed.py)."""

from __future__ import annotations

import io

import httpx
import pytest
from recorded_api import RecordedApi

from lockgate_cli import root
from lockgate_cli.root import candidates
from lockgate_cli.session import Session


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash", "complete -o nosort -F _lockgate_completion lockgate"),
    ("zsh", "#compdef lockgate"), ("fish", "complete --no-files --command lockgate")])
def test_completion_prints_each_shells_script(shell: str, marker: str) -> None:
    ran = RecordedApi().run("completion", shell)
    assert ran.code == 0, ran.err
    assert marker in ran.out and "_LOCKGATE_COMPLETE" in ran.out
    assert RecordedApi().run("completion", "tcsh").code == 2


@pytest.mark.parametrize(("words", "expected"), [
    ([""], {"queue", "status", "trace", "completion", "config"}),
    (["qu"], {"queue"}),
    (["queue", ""], {"create", "update", "cordon", "uncordon", "delete", "get", "list"}),
    (["queue", "create", "q", "--we"], {"--weight"}),
    (["queue", "list", "-o", ""], {"table", "wide", "name", "json", "yaml", "jsonpath="}),
    (["completion", ""], {"bash", "zsh", "fish"}),
    (["jobs", "list", "--state", "q"], {"queued"}),
    (["queue", "create", "q", "--only"], {"--only-kind"}),
    (["queue", "create", "q", "--allow-kind", "dask"],
     {"daskworkergroups.kubernetes.dask.org", "daskclusters.kubernetes.dask.org"}),
    (["queue", "update", "q", "--disallow-kind", "se"], {"secrets", "services"}),
])
def test_commands_options_and_choices_complete(words: list[str], expected: set[str]) -> None:
    assert expected <= set(candidates(words)), candidates(words)


def test_queue_names_complete_from_the_api_and_nothing_when_it_is_unreachable() -> None:
    # No admin API on this port: completion offers nothing rather than failing the shell.
    assert candidates(["--api", "http://127.0.0.1:9", "queue", "get", ""]) == []


def test_the_plugins_name_is_in_its_usage() -> None:
    err = io.StringIO()
    code = root.main(["queue", "create"], out=io.StringIO(), err=err, env={},
                     prog_name="kubectl lockgate")
    assert code == 2
    assert err.getvalue().startswith("kubectl lockgate queue create: Missing argument 'NAME'")
    assert "See 'kubectl lockgate queue create --help'." in err.getvalue()


def test_pod_names_complete_from_the_api_for_explain_and_trace() -> None:
    """Issue 38, item 7: `explain` did not complete pod names."""
    def job(cluster: str, name: str) -> dict[str, str]:
        return {"cluster": cluster, "namespace": "team-a", "name": name}

    def jobs(request: httpx.Request) -> dict[str, object]:
        cluster = request.url.params.get("cluster")
        listed = [job("cluster-a", "train-0"), job("cluster-a", "train-1"),
                  job("cluster-b", "eval-0")]
        return {"jobs": [j for j in listed if cluster in (None, j["cluster"])], "total": 3}

    recorded = RecordedApi().on("GET", "/api/v1/jobs", jobs)
    session = Session(transport=httpx.MockTransport(recorded.handle), env={})
    api = ["--api", "http://lockgate.test"]
    assert candidates([*api, "explain", ""], session=session) == [
        "cluster-a/team-a/train-0", "cluster-a/team-a/train-1", "cluster-b/team-a/eval-0"]
    assert candidates([*api, "explain", "cluster-a/team-a/train-1"], session=session) == [
        "cluster-a/team-a/train-1"]
    assert recorded.sent[-1].query == {"limit": "1000", "cluster": "cluster-a"}
    assert candidates([*api, "trace", "cluster-b/"], session=session) == [
        "cluster-b/team-a/eval-0"]
