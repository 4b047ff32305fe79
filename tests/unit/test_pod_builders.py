"""The one pod builder (tests/helpers/pods.py) that every tier uses."""

from __future__ import annotations

from helpers.pods import COMPLETE_ANNOTATION, a_deployment, a_pod
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE


def test_a_builder_is_a_template_every_call_returns_a_new_one() -> None:
    base = a_pod("p").in_queue("q")
    gated = base.gated()
    assert base.manifest()["spec"].get("schedulingGates") is None
    assert gated.manifest()["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert base.requesting(cpu="1").manifest() != base.manifest()


def test_a_manifest_is_what_a_user_sends_and_obj_what_the_apiserver_returns() -> None:
    pod = a_pod("p").in_namespace("ns").in_queue("q", "js").requesting(cpu="1", memory="1Gi")
    manifest = pod.manifest()
    assert manifest["metadata"] == {"name": "p", "namespace": "ns",
                                    "labels": {QUEUE_LABEL: "q", JOBSET_LABEL: "js"}}
    assert "status" not in manifest
    assert manifest["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1",
                                                                          "memory": "1Gi"}
    read = pod.on_node("n1").in_phase("Running").being_deleted().at_version("9").obj()
    assert read["metadata"]["uid"] == "uid-p" and read["metadata"]["resourceVersion"] == "9"
    assert "deletionTimestamp" in read["metadata"]
    assert read["spec"]["nodeName"] == "n1" and read["status"] == {"phase": "Running"}


def test_fields_never_set_are_absent_and_fields_set_empty_are_empty() -> None:
    plain = a_pod("p").manifest()
    assert "labels" not in plain["metadata"] and "annotations" not in plain["metadata"]
    assert "schedulingGates" not in plain["spec"]
    empty = a_pod("p").labelled({}).annotated({}).with_gates().manifest()
    assert empty["metadata"]["labels"] == {} and empty["metadata"]["annotations"] == {}
    assert empty["spec"]["schedulingGates"] == []


def test_containers_init_containers_and_sidecars_are_added_in_order() -> None:
    spec = (a_pod("p").requesting(cpu="1").with_container(cpu="2")
            .with_init(cpu="3").with_init(sidecar=True, cpu="4").manifest()["spec"])
    assert [c["resources"]["requests"] for c in spec["containers"]] == [{"cpu": "1"},
                                                                       {"cpu": "2"}]
    assert [c.get("restartPolicy") for c in spec["initContainers"]] == [None, "Always"]


def test_a_deployments_pods_are_made_from_a_pod_builder() -> None:
    template = a_pod("ignored").in_queue("q").requesting(cpu="1").completing_after("5s")
    deployment = a_deployment("web").in_namespace("ns").with_replicas(3).of(template).manifest()
    assert deployment["metadata"] == {"name": "web", "namespace": "ns", "labels": {}}
    pods = deployment["spec"]["template"]
    assert pods["metadata"]["labels"] == {QUEUE_LABEL: "q", "app": "web"}
    assert pods["metadata"]["annotations"] == {COMPLETE_ANNOTATION: "5s"}
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert "name" not in pods["metadata"]
