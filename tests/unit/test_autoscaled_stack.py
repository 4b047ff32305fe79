"""The stack's autoscaled clusters (devstack.karpenter): only when asked, recorded until `down`,
on ports of their own, with Karpenter among their components. Nothing here starts a process: a
`down` of a stack that runs nothing only forgets."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from devstack import kube
from devstack.config import AUTOSCALED_CLUSTERS, CLUSTERS, Settings
from devstack.errors import StackError
from devstack.gobuild import GoTool, SourceEdit, _apply_edit
from devstack.karpenter import BINARY, CRDS, TOOL, karpenter_dir
from devstack.stack import Stack, launcher_ports


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("LOCKGATE_STACK_DIR", str(tmp_path / "stack"))
    monkeypatch.setenv("LOCKGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCKGATE_AUTOSCALED_CLUSTERS", raising=False)
    monkeypatch.delenv("LOCKGATE_STACK_PORT_OFFSET", raising=False)
    return Settings.from_env()


def names(stack: Stack) -> list[str]:
    return [component.name for component in stack.components()]


def test_the_fixed_size_stack_has_no_autoscaled_cluster_unless_asked(settings: Settings) -> None:
    stack = Stack(settings)
    assert [c.name for c in stack.all_clusters] == list(CLUSTERS)
    assert not any(name.endswith("/karpenter") for name in names(stack))
    assert not any(name.startswith(AUTOSCALED_CLUSTERS) for name in names(stack))
    info = stack.info()
    assert set(info.kubeconfigs) == set(CLUSTERS)
    assert info.autoscaled_kubeconfigs == {}
    assert info.including_autoscaled() == info


def test_an_autoscaled_cluster_runs_karpenter_and_has_no_fixed_node(settings: Settings) -> None:
    stack = Stack(settings, autoscaled=["cluster-c"])
    (grown,) = stack.autoscaled_clusters
    assert grown.name == "cluster-c" and grown.autoscaled
    assert grown.node_names() == []
    assert [f"cluster-c/{kind}" for kind in ("etcd", "kube-apiserver",
                                             "kube-controller-manager", "kube-scheduler",
                                             "kwok", "karpenter")] == [
        name for name in names(stack) if name.startswith("cluster-c/")]
    karpenter = stack.component("cluster-c/karpenter")
    assert karpenter.argv[0] == str(karpenter_dir(settings) / BINARY)
    assert "--disable-leader-election=true" in karpenter.argv
    assert karpenter.env == {"KUBECONFIG": str(grown.component_kubeconfig("karpenter"))}
    ports = settings.cluster_ports["cluster-c"]
    assert karpenter.ports == [ports.karpenter_metrics, ports.karpenter_health]
    # The fixed clusters keep exactly their components.
    assert [n for n in names(stack) if not n.startswith("cluster-c/")] == names(Stack(settings))


def test_tests_reach_the_autoscaled_cluster_through_including_autoscaled(
        settings: Settings) -> None:
    info = Stack(settings, autoscaled=["cluster-c"]).info()
    assert set(info.kubeconfigs) == set(CLUSTERS)  # a run naming no cluster: the fixed ones
    wider = info.including_autoscaled()
    assert wider.kubeconfigs["cluster-c"] == str(settings.kubeconfig("cluster-c"))
    assert set(wider.kubeconfigs_of("ungater", {"grown": "cluster-c"})) == {"grown"}
    assert "LOCKGATE_AUTOSCALED_KUBECONFIG_CLUSTER_C" in info.env()
    assert "LOCKGATE_KUBECONFIG_CLUSTER_C" not in info.env()


def test_the_setting_asks_as_the_option_does(settings: Settings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_AUTOSCALED_CLUSTERS", " cluster-c, ")
    assert [c.name for c in Stack(Settings.from_env()).autoscaled_clusters] == ["cluster-c"]


def test_a_fixed_or_unknown_cluster_cannot_be_autoscaled(settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StackError, match="cluster-a cannot be autoscaled"):
        Stack(settings, autoscaled=["cluster-a"])
    monkeypatch.setenv("LOCKGATE_AUTOSCALED_CLUSTERS", "cluster-z")
    with pytest.raises(StackError, match="LOCKGATE_AUTOSCALED_CLUSTERS: cluster-z"):
        Settings.from_env()


def test_the_record_keeps_it_until_down(settings: Settings) -> None:
    asked = Stack(settings, autoscaled=["cluster-c"])
    settings.stack_dir.mkdir(parents=True)
    asked._record_autoscaled()
    later = Stack(settings)  # a plain `status`, `up` or a test session's ensure_up
    assert [c.name for c in later.autoscaled_clusters] == ["cluster-c"]
    later.down()  # runs nothing here: stops nothing, forgets the autoscaled cluster
    assert Stack(settings).autoscaled_clusters == []


def test_autoscaled_ports_are_their_own(settings: Settings) -> None:
    taken: list[int] = []
    for name in (*CLUSTERS, *AUTOSCALED_CLUSTERS):
        ports = settings.cluster_ports[name]
        taken += [getattr(ports, f.name) for f in fields(ports) if getattr(ports, f.name)]
    assert len(taken) == len(set(taken)), "two clusters share a port"
    assert not set(taken) & set(launcher_ports(0))


def test_karpenter_is_built_with_its_crds_and_bound_to_loopback() -> None:
    assert TOOL.package == "kwok" and TOOL.binary == BINARY
    assert {name for _, name in TOOL.files} == set(CRDS)
    assert all("127.0.0.1:%d" in edit.new and '":%d"' in edit.old for edit in TOOL.edits)


def test_a_source_edit_that_no_longer_matches_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "main.go").write_text('addr := fmt.Sprintf(":%d", port)\n')
    tool = GoTool(title="t", module="example.com/t", version="v1", package="", binary="t")
    _apply_edit(tmp_path, SourceEdit("main.go", '":%d"', '"127.0.0.1:%d"'), tool)
    assert (tmp_path / "main.go").read_text() == 'addr := fmt.Sprintf("127.0.0.1:%d", port)\n'
    with pytest.raises(StackError, match=r"holds 0 \(not 1\) occurrences"):
        _apply_edit(tmp_path, SourceEdit("main.go", '":%d"', '"127.0.0.1:%d"'), tool)


def test_only_an_autoscaled_clusters_kwok_sizes_nodes_by_their_instance_type(
        settings: Settings) -> None:
    stack = Stack(settings, autoscaled=["cluster-c"])
    for cluster in stack.all_clusters:
        cluster.prepare()
    written = {c.name: (c.dir / "kwok.yaml").read_text() for c in stack.all_clusters}
    generic = (Path(kube.__file__).with_name("kwok-stages.yaml")).read_text()
    for name in CLUSTERS:
        assert written[name].endswith(generic), f"{name}'s kwok Stages changed"
    assert written["cluster-c"].endswith(kube.instance_sized_stages(generic))
    assert "karpenter.kwok.sh/instance-cpu" in written["cluster-c"]
    with pytest.raises(StackError, match="node capacity block changed"):
        kube.instance_sized_stages(generic.replace('cpu: "16"', 'cpu: "32"'))
