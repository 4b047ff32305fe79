"""The scheduler: one pure package, from the state it keeps to what a waiting pod is told.

Why a package: the round, its room, preemption, explain and status must judge by one state and
one cost model. Its modules talk only through public names, in layers (pyproject.toml's
import-linter contract keeps them so): `state` at the bottom, built on `target_inputs`,
`pending`, `room_caches`, `records` and `groups`; `costs` (the one cost model); `room`;
`round`; then `preemption`, `explain`, `waiting` and `invariants` (the
state's consistency check, which the unit tests run after every operation); and on top `feed`
(the hold-out policy between the job rows and the state). docs/scheduling.md describes the
policy, docs/ARCHITECTURE.md where each part lives. Services, adapters, tests and the benchmarks
import from here.
"""

from lockgate.scheduler.costs import FairShare, adjusted_fair_shares, fair_shares
from lockgate.scheduler.explain import (
    EVENT_REASONS,
    MAX_QUEUED_EVENT_REASON,
    QUEUED_EVENT_REASON,
    Explainer,
    Explanation,
    GroupStanding,
    GrowthStanding,
    QueueStatus,
    Reservation,
    WaitFacts,
    WaitReason,
    choose_reason,
    explain,
    format_amount,
    format_duration,
    group_text,
    queue_statuses,
    reservation_text,
    wait_message,
)
from lockgate.scheduler.feed import PHASE_OF_STATE, PHASES, Feed, FeedPolicy
from lockgate.scheduler.groups import (
    GroupIndex,
    GroupKey,
    GroupStatus,
    describe_group,
    timed_out,
    timeout_message,
)
from lockgate.scheduler.invariants import check_invariants
from lockgate.scheduler.preemption import (
    PREEMPTIBLE_LABEL,
    Eviction,
    PreemptionPolicy,
    plan_evictions,
)
from lockgate.scheduler.room_caches import NodeInfo
from lockgate.scheduler.round import (
    UNSCHEDULABLE_REASONS,
    Decision,
    GrowthGate,
    GrowthNote,
    QueueOutcome,
    QueueReport,
    RoundResult,
    SkipReason,
    growth_gate,
    schedule_round,
)
from lockgate.scheduler.state import (
    DEFAULT_FAIRNESS_RESOURCES,
    GrowthRelease,
    QueueUsage,
    SchedJob,
    SchedulerState,
)
from lockgate.scheduler.target_inputs import TargetsKey
from lockgate.scheduler.targets import FairTargets, TargetProblem, solve_problem
from lockgate.scheduler.waiting import NoticeLimits, TokenBucket, WaitingPods

__all__ = [
    "DEFAULT_FAIRNESS_RESOURCES",
    "EVENT_REASONS",
    "MAX_QUEUED_EVENT_REASON",
    "PHASES",
    "PHASE_OF_STATE",
    "PREEMPTIBLE_LABEL",
    "QUEUED_EVENT_REASON",
    "UNSCHEDULABLE_REASONS",
    "Decision",
    "Eviction",
    "Explainer",
    "Explanation",
    "FairShare",
    "FairTargets",
    "Feed",
    "FeedPolicy",
    "GroupIndex",
    "GroupKey",
    "GroupStanding",
    "GroupStatus",
    "GrowthGate",
    "GrowthNote",
    "GrowthRelease",
    "GrowthStanding",
    "NodeInfo",
    "NoticeLimits",
    "PreemptionPolicy",
    "QueueOutcome",
    "QueueReport",
    "QueueStatus",
    "QueueUsage",
    "Reservation",
    "RoundResult",
    "SchedJob",
    "SchedulerState",
    "SkipReason",
    "TargetProblem",
    "TargetsKey",
    "TokenBucket",
    "WaitFacts",
    "WaitReason",
    "WaitingPods",
    "adjusted_fair_shares",
    "check_invariants",
    "choose_reason",
    "describe_group",
    "explain",
    "fair_shares",
    "format_amount",
    "format_duration",
    "group_text",
    "growth_gate",
    "plan_evictions",
    "queue_statuses",
    "reservation_text",
    "schedule_round",
    "solve_problem",
    "timed_out",
    "timeout_message",
    "wait_message",
]
