"""What `lockgate status` shows of usage history (decayed usage, effective weight, who history
ranks below a sibling), and explain's words when history is what holds a pod back."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest
from builders import a_job, a_node, a_state

from lockgate.queue_tree import QueueTree
from lockgate.scheduler import schedule_round
from lockgate.scheduler.history import UsageHistory
from lockgate.scheduler.report import ExplainSettings, report_round, status_json
from lockgate_cli.output import Output, render
from lockgate_cli.status import status_view


def a_queue(name: str, **fields: Any) -> dict[str, Any]:
    return {"queue": name, "name": name, "defined": True, "cordoned": False, "weight": 1.0,
            "fair_share": 0.5, "adjusted_fair_share": 0.5, "actual_share": 0.25,
            "fair_target": 0.5, "queued": 4, "released": 0, "running": 4,
            "oldest_wait_seconds": None, **fields}


def test_status_wide_shows_decayed_usage_and_the_effective_weight() -> None:
    words = "ranked below its sibling idle: hog used 2.0x its share over the last half-life"
    answer = {"queues": [a_queue("hog", decayed_usage=240.0, effective_weight=0.25,
                                 history=words),
                         a_queue("idle", decayed_usage=0.0, effective_weight=1.0, history="")],
              "reasons_unavailable": None}
    wide, plain = io.StringIO(), io.StringIO()
    render(wide, Output("wide"), status_view(answer))
    render(plain, Output("table"), status_view(answer))
    lines = wide.getvalue().splitlines()
    assert lines[0].split()[-2:] == ["DECAYED-USAGE", "EFF-WEIGHT"]
    hog = next(line for line in lines if line.startswith("hog"))
    assert hog.split()[-2:] == ["4m", "0.25"]
    assert f"history: queue hog is {words}" in plain.getvalue()
    assert "DECAYED-USAGE" not in plain.getvalue()


def test_explain_says_history_ranks_the_queue_below_its_sibling() -> None:
    """hog held the cluster, idle nothing; both ask. After the history weights apply, hog's
    waiting pod is told why: history ranks it below idle."""
    state = (a_state().with_queues("hog", "idle")
             .with_cluster("A", a_node(cpu="4", memory="16Gi").times(1, prefix="n"))
             .with_jobs(a_job("hog").requesting(cpu="1", memory="1Gi").in_cluster("A")
                        .running_on("n0").times(4),
                        a_job("hog").requesting(cpu="1", memory="1Gi").in_cluster("A").times(2),
                        a_job("idle").requesting(cpu="1", memory="1Gi").in_cluster("A")
                        .times(4))
             .build())
    history = UsageHistory(half_life_seconds=120.0, recompute_seconds=60.0, tolerance=0.05,
                           at=0.0)
    history.observe(now=300.0, shares=state.dominant_shares())
    assert state.dominant_shares() == {"hog": 1.0}
    tree = QueueTree.flat({"hog": 1.0, "idle": 1.0})
    assert history.recompute(tree, now=300.0)
    state.use_history_weights(history.weights_in_force)
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=10, now=300.0)
    report = report_round(state, result, number=1, at=300.0, phases={"hog": Counter()},
                          settings=ExplainSettings(preemption=False, group_reserve_after=None,
                                                   holds=False),
                          history=history.report(tree))
    hog = status_json(next(s for s in report.queues if s.queue == "hog"))
    assert hog["effective_weight"] == 0.25 and hog["decayed_usage"] > 0
    assert hog["fair_target"] == pytest.approx(0.25 / 1.25)  # 1/4 : 1 of the pool
    waiting = [job_id for job_id, job in state.job_records.items()
               if job.queue == "hog" and job.state.value == "queued"]
    explanation = report.explain([(waiting[0], None)], now=300.0)[waiting[0]]
    assert explanation is not None
    assert explanation.history.startswith("ranked below its sibling idle: hog used 2.0x")
    assert "ranked below its sibling idle" in explanation.message
