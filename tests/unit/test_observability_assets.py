"""The Grafana dashboard and the Prometheus alert rules (deploy/observability) name only metrics
that lockgate's services really expose, under the names Prometheus sees.

The services declare their metrics at import (prometheus_client's default registry); this
imports every service module that declares any, and derives the exposed series names from each
family's type (a counter `x` is scraped as `x_total`, a histogram as `x_bucket`, `x_sum`,
`x_count`), so a renamed metric or a typo in a panel fails here, not on a dark dashboard.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "deploy" / "observability"
METRIC_MODULES = (
    "services.admission_webhook.server", "services.cluster_watcher.watching",
    "services.cluster_watcher.publishing", "services.fair_scheduler.reporting",
    "services.queue_store.ingesting", "services.queue_store.collecting",
    "services.queue_store.queue_sync", "services.queue_store.namespaces",
    "services.ungater.ungating", "services.ungater.noticing", "lockgate_adapters.kafka",
)
METRIC_NAME = re.compile(r"\blockgate_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("_sum", "_count", "")}


def exposed_series() -> set[str]:
    for module in METRIC_MODULES:
        importlib.import_module(module.removeprefix("services."))
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("lockgate_"):
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((ASSETS / "grafana-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def rule_expressions() -> list[str]:
    rules = yaml.safe_load((ASSETS / "prometheus-rules.yaml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def test_every_metric_the_dashboard_and_the_alerts_name_is_exposed() -> None:
    exposed = exposed_series()
    assert len(exposed) > 40, sorted(exposed)  # the services' metrics were found at all
    for source, expressions in (("dashboard", dashboard_expressions()),
                                ("alert rules", rule_expressions())):
        assert expressions, f"no expressions in the {source}"
        for expression in expressions:
            unknown = set(METRIC_NAME.findall(expression)) - exposed
            assert not unknown, f"{source}: {expression!r} names {sorted(unknown)}, which no " \
                                "service exposes"


def test_every_alert_says_how_bad_and_what_happened() -> None:
    rules = yaml.safe_load((ASSETS / "prometheus-rules.yaml").read_text())
    names = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    assert len(names) == len(set(names)), names
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule
            assert rule["annotations"]["summary"], rule


def test_the_dashboard_covers_every_service() -> None:
    expressions = " ".join(dashboard_expressions())
    for prefix in ("lockgate_scheduler_", "lockgate_ungater_", "lockgate_admission_",
                   "lockgate_watcher_", "lockgate_queue_store_", "lockgate_queue_sync_",
                   "lockgate_dead_letters"):
        assert prefix in expressions, f"no panel shows {prefix}*"
