"""The service image ships only what the services run: the Dockerfile's COPY lines and the build
context devstack makes for `make compose-test` (devstack.images) name the same folders, and
neither holds devstack, the CLI, the tests or the benchmarks."""

from __future__ import annotations

import re

from devstack.images import IMAGE_SOURCES, REPO, lockgate_sources


def copied_folders() -> set[str]:
    """The sources of the Dockerfile's `COPY <folder> ./<folder>` lines."""
    dockerfile = (REPO / "Dockerfile").read_text()
    return {source for source, target in re.findall(r"^COPY (\S+) \./(\S+)$", dockerfile,
                                                    flags=re.MULTILINE)
            if source == target}


def test_the_dockerfile_copies_the_folders_devstack_sends_it() -> None:
    assert copied_folders() == set(IMAGE_SOURCES)


def test_the_image_holds_the_services_their_core_and_adapters_and_nothing_else() -> None:
    packages = {"/".join(rel.split("/")[:2]) for rel, _ in lockgate_sources() if "/" in rel}
    assert packages == {"libs/lockgate", "libs/lockgate_adapters", "services/admission_webhook",
                        "services/cluster_watcher", "services/fair_scheduler",
                        "services/queue_store", "services/ungater"}
    assert not [rel for rel, _ in lockgate_sources() if rel.endswith("testing.py")]
