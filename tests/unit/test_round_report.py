"""The leader's report of a round: the one picture status, explain and the web UI read.

Its queue standings are built from the round's results and the leader's running tallies (no
pass over the jobs); they must say exactly what a pass over the state's jobs says
(`queue_statuses`, kept as the independent check). Its explanations are the leader's explainer's,
and a standby or a leader before its first round gives none."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from builders import a_job, a_node, a_queue, a_state

from fair_scheduler.reporting import ExplainRequestError, FairnessReport
from lockgate.scheduler import (
    PHASE_OF_STATE,
    Explainer,
    SchedulerState,
    queue_statuses,
    schedule_round,
)
from lockgate.scheduler.report import ExplainSettings, RoundReport, report_round
from lockgate.scheduler.tree_status import tree_node_json, tree_statuses

SETTINGS = ExplainSettings(preemption=False, group_reserve_after=None, holds=True)
NOW = 1_700_000_000.0


def _phases(state: SchedulerState) -> dict[str, Counter[str]]:
    """The leader's tallies (`Feed.phases`), counted here from the jobs."""
    phases: dict[str, Counter[str]] = {}
    for job in state.job_records.values():
        phase = PHASE_OF_STATE.get(job.state)
        if phase is not None:
            phases.setdefault(job.queue, Counter())[phase] += 1
    return phases


def _contested() -> SchedulerState:
    return (a_state().with_queues("heavy", "light", a_queue("cordoned-q").cordoned())
            .with_cluster("cluster-a", a_node(cpu="8", memory="16Gi").times(2))
            .with_cluster("cluster-b", a_node(cpu="4", memory="8Gi").times(1))
            .with_jobs(a_job("heavy").requesting(cpu="2", memory="1Gi").times(12),
                       a_job("light").requesting(cpu="1", memory="1Gi")
                       .in_cluster("cluster-b").times(6),
                       a_job("cordoned-q").times(2),
                       a_job("ghost").times(2))  # a queue nobody defined
            .build())


def _report(state: SchedulerState) -> RoundReport:
    result = schedule_round(state, max_decisions=5, max_lookback_per_queue=10, now=NOW)
    return report_round(state, result, number=3, at=NOW, phases=_phases(state),
                        settings=SETTINGS)


def test_the_round_report_says_what_a_pass_over_the_jobs_says() -> None:
    state = _contested()
    report = _report(state)
    by_pass = {s.queue: s for s in queue_statuses(state)}
    assert [s.queue for s in report.queues] == sorted(by_pass)
    for status in report.queues:
        assert status.oldest_queued_at is None  # Postgres adds it
        expected = dataclasses.replace(by_pass[status.queue], oldest_queued_at=None)
        assert status == expected, status.queue
    ghost = report.status_of("ghost")
    assert ghost is not None and not ghost.defined and ghost.weight == 0.0
    # The round's own part: it released up to its limit of 5 and said why others wait.
    assert sum(part.released for part in report.rounds.values()) == 5
    assert report.rounds["ghost"].outcome == "undefined"


def test_explanations_are_the_leaders_explainers_with_the_place_given() -> None:
    state = _contested()
    report = _report(state)
    waiting = [job_id for job_id, job in state.job_records.items()
               if job.state.value == "queued"]
    assert waiting
    asked = [(job_id, (index + 1, len(waiting))) for index, job_id in enumerate(waiting)]
    told = report.explain([*asked, ("cluster-a/no-such-uid", None)], now=NOW + 1)
    assert told["cluster-a/no-such-uid"] is None
    direct = Explainer(state, now=NOW + 1, preemption=False, holds=True)
    for job_id, place in asked:
        said = told[job_id]
        assert said is not None and said.position == place[0]
        assert said == direct.explain(job_id, place)


def test_a_standby_and_a_leader_before_its_first_round_explain_nothing() -> None:
    state = _contested()
    job_id = next(job_id for job_id, job in state.job_records.items()
                  if job.state.value == "queued")
    fairness = FairnessReport("standby")
    body = {"jobs": [{"id": job_id, "place": [1, 1]}]}
    assert fairness.explain_json(body, now=NOW) == {
        "instance_id": "standby", "leader": False, "round": None, "explanations": {}}
    assert fairness.as_json()["queues"] == []
    fairness.set_leader(True)
    assert fairness.explain_json(body, now=NOW)["round"] is None  # loading: no picture yet
    fairness.record_round(_report(state), seconds=0.01, decisions=5)
    answer = fairness.explain_json(body, now=NOW)
    assert answer["leader"] is True and answer["round"]["number"] == 3
    assert answer["explanations"][job_id] is not None
    assert {q["name"] for q in fairness.as_json()["queues"]} == {"heavy", "light", "ghost",
                                                                 "cordoned-q"}
    fairness.set_leader(False)  # stepped down: the picture goes at once
    assert fairness.explain_json(body, now=NOW)["explanations"] == {}
    assert fairness.as_json()["queues"] == []


def test_a_job_held_out_of_the_line_says_why() -> None:
    state = _contested()
    fairness = FairnessReport("leader")
    fairness.set_leader(True)
    fairness.record_round(_report(state), seconds=0.01, decisions=5)
    fairness.held_out = lambda job_id: (("backing_off", NOW + 30) if job_id == "c/held"
                                        else (None, None))
    answer = fairness.explain_json({"jobs": [{"id": "c/held", "place": None},
                                             {"id": "c/gone", "place": None}]}, now=NOW)
    assert answer["explanations"] == {
        "c/held": {"explanation": None, "held_out": "backing_off", "retry_due": NOW + 30},
        "c/gone": None}


@pytest.mark.parametrize("body", [None, {}, {"jobs": "x"}, {"jobs": [{"id": "no-slash"}]},
                                  {"jobs": [{"id": "c/u", "place": [1]}]},
                                  {"jobs": [{"id": "c/u", "place": [-1, 2]}]},
                                  {"jobs": [{"id": "c/u"}] * 1001}])
def test_a_malformed_explain_request_is_refused_with_a_reason(body: object) -> None:
    fairness = FairnessReport("leader")
    fairness.set_leader(True)
    with pytest.raises(ExplainRequestError):
        fairness.explain_json(body, now=NOW)


def test_the_fairness_answer_is_encoded_once_per_round_and_never_outlives_the_lead() -> None:
    state = _contested()
    fairness = FairnessReport("leader")
    fairness.set_leader(True)
    fairness.record_round(_report(state), seconds=0.01, decisions=5)
    first = fairness.encoded()
    assert fairness.encoded() is first  # the same round: the same bytes
    assert json.loads(first) == fairness.as_json()
    # By default each queue's figures alone; per cluster only at /api/v1/fairness/clusters,
    # encoded once per round too, and otherwise the same answer.
    per_cluster = fairness.encoded_per_cluster()
    assert fairness.encoded_per_cluster() is per_cluster
    wide = json.loads(per_cluster)
    assert wide == fairness.as_json(per_cluster=True)
    state_cluster_keys = {"cluster_targets", "cluster_shares", "clusters"}
    assert all(not state_cluster_keys & set(q) for q in json.loads(first)["queues"])
    assert all(state_cluster_keys <= set(q) for q in wide["queues"]
               if q["name"] in ("heavy", "light"))
    assert any(q["cluster_targets"] for q in wide["queues"])
    assert [{k: v for k, v in q.items() if k not in state_cluster_keys}
            for q in wide["queues"]] == json.loads(first)["queues"]
    fairness.record_round(_report(state), seconds=0.01, decisions=0)
    assert fairness.encoded() is not first  # a new round
    assert fairness.encoded_per_cluster() is not per_cluster
    fairness.set_leader(False)
    assert json.loads(fairness.encoded())["queues"] == []


def _asked(state: SchedulerState, queue: str = "cordoned-q") -> dict[str, object]:
    job_id = next(job_id for job_id, job in state.job_records.items()
                  if job.state.value == "queued" and job.queue == queue)
    return {"jobs": [{"id": job_id, "place": [1, 2]}]}


def test_a_pod_asked_about_again_is_answered_off_the_loop_from_the_last_round_only() -> None:
    """`answered` (the health server's thread) gives only what the loop explained from the
    last round's picture: nothing for a pod never asked about, nothing once the next round
    is reported until the loop explained it again, and then the new round's answer."""
    state = _contested()
    fairness = FairnessReport("leader")
    fairness.set_leader(True)
    body = _asked(state)
    assert fairness.answered(body) is None  # no round yet
    fairness.record_round(_report(state), seconds=0.01, decisions=5)
    assert fairness.answered(body) is None  # never explained: the loop must
    on_loop = fairness.explain_json(body, now=NOW)
    assert fairness.answered(body) == on_loop  # asked again: from the picture, off the loop
    once = _asked(state, queue="heavy")
    fairness.explain_json(once, now=NOW)  # asked once only: not explained again
    assert fairness.answered({"jobs": [{"id": body["jobs"][0]["id"],  # type: ignore[index]
                                        "place": [2, 2]}]}) is None  # another place
    later = report_round(state, schedule_round(state, max_decisions=5,
                                               max_lookback_per_queue=10, now=NOW + 1),
                         number=4, at=NOW + 1, phases=_phases(state), settings=SETTINGS)
    fairness.record_round(later, seconds=0.01, decisions=0)
    assert fairness.answered(body) is None  # round 3's answer is older than the last round
    assert fairness.explain_again(now=NOW + 1) == 1  # the pod asked about again lately
    assert fairness.answered(once) is None
    again = fairness.answered(body)
    assert again is not None and again["round"]["number"] == 4
    assert again == fairness.explain_json(body, now=NOW + 1)
    fairness.set_leader(False)  # stepped down: nothing is answered off the loop
    assert fairness.answered(body) is None
    with pytest.raises(ExplainRequestError):
        fairness.answered({"jobs": "x"})


def test_the_fairness_answer_reads_only_the_picture_of_the_last_round() -> None:
    """The health server's thread encodes the answer while the next round may run on the
    loop: what it encodes must not move with the live state (the tree included)."""
    state = _contested()
    fairness = FairnessReport("leader")
    fairness.set_leader(True)
    fairness.record_round(_report(state), seconds=0.01, decisions=5)
    tree_then = [tree_node_json(node) for node in tree_statuses(state)]
    # The next round runs (it changes the state in place), not reported yet.
    schedule_round(state, max_decisions=50, max_lookback_per_queue=10, now=NOW + 1)
    assert [tree_node_json(node) for node in tree_statuses(state)] != tree_then  # it moved
    assert json.loads(fairness.encoded())["tree"] == json.loads(json.dumps(tree_then))
