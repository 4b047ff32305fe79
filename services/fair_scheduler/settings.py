"""The fair scheduler's settings, from LOCKGATE_SCHEDULER_* variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lockgate.backoff import BackoffPolicy
from lockgate.decayed_usage import HistoryPolicy
from lockgate.growth import GrowthPolicy
from lockgate.node_groups import NodeGroup
from lockgate.resources import InvalidQuantityError, Resources
from lockgate.scheduler import FeedPolicy, NoticeLimits
from lockgate_adapters.scheduler_store import SessionLiveness
from lockgate_adapters.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    """Leadership, round triggering and limits, and re-publishing of unanswered releases."""

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_SCHEDULER_", env_nested_delimiter="__",
                                      extra="forbid")
    service_name: ClassVar[str] = "fair-scheduler"
    # The leader's picture of its last round is served from the health server's own thread,
    # so `status` and the UI's overview never wait for the round in progress (issue 37).
    health_own_thread: ClassVar[bool] = True

    # Leadership
    standby_retry_seconds: float = Field(
        default=1.0, gt=0, description="how often a standby tries to take the leader lock")
    # A leader whose connection died silently steps down within
    # leader_check_interval_seconds + leader_check_timeout_seconds (plus the rest of a round in
    # progress, each of its queries bounded by leader_command_timeout_seconds); Postgres ends
    # that session, freeing the lock for a standby, after leader_idle_session_timeout_seconds.
    # See docs/security.md ("The leader's connection").
    leader_check_interval_seconds: float = Field(
        default=2.0, gt=0, description="how often the leader checks its connection answers")
    leader_check_timeout_seconds: float = Field(
        default=3.0, gt=0, description="how long that check may take before it steps down")
    leader_command_timeout_seconds: float = Field(
        default=120.0, gt=0, description="the longest any query on the leader connection may "
                                         "take (the first load of a large backlog included)")
    leader_idle_session_timeout_seconds: float = Field(
        default=30.0, gt=0,
        description="Postgres ends a leader session idle this long (a leader gone silently), "
                    "freeing the lock; must exceed the check interval plus the longest stretch "
                    "the leader computes without a query (loading a large backlog)")
    postgres_keepalives_idle_seconds: int = Field(default=10, ge=1)
    postgres_keepalives_interval_seconds: int = Field(default=5, ge=1)
    postgres_keepalives_count: int = Field(default=3, ge=1)
    postgres_tcp_user_timeout_seconds: float = Field(
        default=20.0, gt=0, description="unacknowledged data for this long drops the connection")

    @model_validator(mode="after")
    def _idle_timeout_above_checks(self) -> SchedulerSettings:
        least = self.leader_check_interval_seconds + self.leader_check_timeout_seconds
        if self.leader_idle_session_timeout_seconds <= least:
            raise ValueError(
                f"leader_idle_session_timeout_seconds ({self.leader_idle_session_timeout_seconds})"
                f" must exceed leader_check_interval_seconds + leader_check_timeout_seconds "
                f"({least}): Postgres would end a live leader's session")
        return self

    @model_validator(mode="after")
    def _early_notices_increase(self) -> SchedulerSettings:
        try:
            NoticeLimits(pod_interval=self.wait_notice_interval_seconds, cluster_rate=1.0,
                         cluster_burst=1.0, early=tuple(self.wait_notice_early_seconds))
        except ValueError as error:
            raise ValueError(f"wait_notice_early_seconds: {error}") from error
        return self

    def backoff_policy(self) -> BackoffPolicy:
        return BackoffPolicy(
            initial_seconds=(self.unplaceable_backoff_initial_seconds
                             or self.unplaceable_after_seconds),
            max_seconds=self.unplaceable_backoff_max_seconds,
            forget_after_seconds=self.unplaceable_backoff_forget_seconds)

    def feed_policy(self) -> FeedPolicy:
        """The hold-out policy (lockgate.scheduler.feed) these settings give."""
        return FeedPolicy(
            release_retry_initial_seconds=self.release_retry_initial_seconds,
            release_retry_max_seconds=self.release_retry_max_seconds,
            unplaceable_after_seconds=self.unplaceable_after_seconds,
            controller_backoff=self.backoff_policy(),
            controller_backoff_enabled=self.unplaceable_backoff,
            notices=NoticeLimits(
                pod_interval=self.wait_notice_interval_seconds,
                early=tuple(self.wait_notice_early_seconds),
                cluster_rate=self.wait_notices_per_cluster_per_second,
                cluster_burst=self.wait_notice_burst_per_cluster))

    def liveness(self) -> SessionLiveness:
        return SessionLiveness(
            check_interval=self.leader_check_interval_seconds,
            check_timeout=self.leader_check_timeout_seconds,
            command_timeout=self.leader_command_timeout_seconds,
            idle_session_timeout=self.leader_idle_session_timeout_seconds,
            keepalive_idle=self.postgres_keepalives_idle_seconds,
            keepalive_interval=self.postgres_keepalives_interval_seconds,
            keepalive_count=self.postgres_keepalives_count,
            tcp_user_timeout=self.postgres_tcp_user_timeout_seconds,
        )
    # Rounds
    debounce_seconds: float = Field(
        default=0.005, ge=0,
        description="after a change notification, wait this long for more, when busy (a round "
                    "ended less than busy_seconds before); an idle scheduler starts at once")
    busy_seconds: float = Field(
        default=0.1, ge=0,
        description="a change this soon after the last round means changes are streaming in: "
                    "debounce to batch them into one round")
    safety_round_seconds: float = Field(
        default=5.0, gt=0, description="run a round at least this often, changes or not")
    max_decisions_per_round: int = Field(default=5000, ge=1)
    max_releases_in_flight_per_cluster: int = Field(
        default=300, ge=0,
        description="releases decided but not yet carried out by the ungaters (jobs in state "
                    "released) a cluster may have; rounds release no more there until some are "
                    "answered, so a newcomer's pods wait behind at most this many (about "
                    "this many divided by the ungaters' rate per cluster); 0: no cap")
    paced_round_seconds: float = Field(
        default=0.25, ge=0,
        description="while a cluster waits for its ungaters (the last round reached its "
                    "max_releases_in_flight_per_cluster), start rounds at most this often: each "
                    "answer would otherwise start a round that releases one or two pods")
    max_lookback_per_queue: int = Field(
        default=1000, ge=0,
        description="jobs that do not fit a queue may skip in one cluster before it stops there")
    max_notices_per_round: int = Field(
        default=100, ge=0,
        description="most pod notices (e.g. 'your queue does not exist') sent after one round; "
        "the rest follow in later rounds; 0 sends none")
    # Placement
    fairness_resources: list[str] = Field(
        default=["cpu", "memory", "nvidia.com/gpu"], min_length=1,
        description="the resources fair shares are computed over (a JSON list in the "
                    "environment); others (ephemeral-storage, hugepages, pods) still have to fit "
                    "a node but never make a queue's dominant share")
    unplaceable_after_seconds: float = Field(
        default=120.0, gt=0,
        description="a released pod kube-scheduler reports Unschedulable for this long stops "
                    "being charged, is reported, and is deleted if a controller owns it")
    delete_unplaceable_controlled: bool = Field(
        default=True,
        description="delete such a pod when a controller owns it, so a gated replacement comes")
    # Back-off per controller (lockgate.backoff; docs/scheduling.md, "Released pods that cannot
    # be placed"): a controller whose pod was deleted that way does not churn.
    unplaceable_backoff: bool = Field(
        default=True,
        description="after such a pod is deleted, its controller's queued pods wait (not "
                    "released) for a delay that doubles with each consecutive give-up; a pod "
                    "of it that binds resets it")
    unplaceable_backoff_initial_seconds: float | None = Field(
        default=None, gt=0,
        description="the first such delay; unset: unplaceable_after_seconds")
    unplaceable_backoff_max_seconds: float = Field(
        default=1800.0, gt=0, description="the longest such delay (the cap of the doubling)")
    unplaceable_backoff_forget_seconds: float = Field(
        default=3600.0, ge=0,
        description="a controller none of whose pods was given up on for this long after its "
                    "delay ended starts again from the first delay")
    # Pods that wait (Events through lockgate.pod-notices.v1; see lockgate.scheduler.waiting)
    wait_notices: bool = Field(
        default=True, description="tell every queued pod, with an Event, why it waits")
    wait_notice_check_seconds: float = Field(
        default=5.0, gt=0, description="look for pods due an Event, or past their maximum time "
        "queued, at most this often (each look costs a pass over the queued pods of the queues "
        "with pods due)")
    wait_notice_early_seconds: list[float] = Field(
        default=[15.0, 45.0], description="seconds after its first Event at which a waiting "
        "pod gets the next ones (a JSON list, increasing; [] for none), so a client that gives "
        "a pod a minute to start (a spawner's progress page) shows why it waits before it "
        "gives up")
    wait_notice_interval_seconds: float = Field(
        default=300.0, gt=0, description="after those, a waiting pod gets another Event at "
        "most this often (per pod)")
    wait_notices_per_cluster_per_second: float = Field(
        default=5.0, gt=0, description="the most wait Events per second per cluster, on average")
    wait_notice_burst_per_cluster: float = Field(
        default=50.0, ge=1, description="... and at once (token bucket size)")
    # Pod groups (docs/scheduling.md, "Gangs"); a group's timeout is its queue's setting.
    group_reserve_after_seconds: float = Field(
        default=60.0, ge=0,
        description="a complete pod group that has not fitted for this long after its last "
                    "member arrived reserves its cluster: nothing else is released there until "
                    "it fits")
    # Fair targets and holds of freed room (docs/scheduling.md, "Fair targets", "Holds").
    room_hold_seconds: float = Field(
        default=120.0, ge=0,
        description="a pod of a queue below its fair target that does not fit has room freed "
                    "on one node held for it for at most this long (then on another node); "
                    "0 turns holds off")
    gc_first_threshold: int = Field(
        default=20_000, ge=700,
        description="Python's garbage collector runs a young collection after this many more "
                    "allocations than deallocations (Python's default 700 makes it rescan a "
                    "large state's millions of long-lived objects every few rounds); see "
                    "lockgate.scheduler.collection")
    gc_full_collection_seconds: float = Field(
        default=6 * 3600.0, gt=0,
        description="what survives a round is frozen out of the garbage collector's scans "
                    "(it is still freed by reference counting); a full collection for cycles "
                    "runs after a round this often instead")
    room_holds_per_queue: int = Field(
        default=1, ge=1,
        description="how many of a queue's pods may have room held for them in one cluster at a "
                    "time (1: its next pod); more gathers room on more nodes at once, at a "
                    "round's cost per hold")
    targets_max_age_seconds: float = Field(
        default=1.0, ge=0,
        description="fair targets are recomputed when demand, weights or capacity change; "
                    "while only amounts change, a result this recent is kept (bounds the cost "
                    "with many queues)")
    targets_worker_min_demands: int = Field(
        default=200, ge=0,
        description="fair targets with at least this many demands (a queue asking in a "
                    "cluster) are solved in a worker process between rounds, and rounds use "
                    "the last ones solved instead of waiting for them (docs/scheduling.md, "
                    "'Fair targets off the round's path'); below it, a round solves them "
                    "itself (a few ms); 0: always in the worker")
    targets_worker_max_age_seconds: float = Field(
        default=30.0, gt=0,
        description="a round uses targets from the worker at most this old (counted from when "
                    "their inputs were taken); older (the worker stalled or died), the round "
                    "solves them itself")
    # Preemption to fair share (docs/scheduling.md, "Preemption"): off unless enabled.
    preemption_enabled: bool = Field(
        default=False, description="evict preemptible pods of queues above their fair share "
                                   "for queues below theirs")
    preemptible_priority_classes: list[str] = Field(
        default_factory=list,
        description="pods of these PriorityClasses are preemptible (as are pods labelled "
                    "lockgate.io/preemptible=true); JSON list")
    max_evictions_per_round: int = Field(default=100, ge=1)
    # Releases that went unanswered
    release_retry_initial_seconds: float = Field(
        default=2.0, gt=0,
        description="a job whose release failed waits this long before it is released again, "
                    "doubling with each failure")
    release_retry_max_seconds: float = Field(
        default=300.0, gt=0, description="the longest such wait")
    republish_after_seconds: float = Field(
        default=60.0, gt=0,
        description="re-publish a release command whose job is still only released this long "
        "after publishing (the ungater is idempotent)")
    # Clusters that grow (docs/autoscaling.md). Amounts are Kubernetes quantities.
    growth_cluster_caps: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="per cluster, the most its NodePools together may still add, for "
                    "resources a pool does not limit (JSON, e.g. "
                    '{"cluster-b": {"cpu": "256", "memory": "1Ti"}})')
    growth_instance_shapes: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description='one node\'s allocatable, by "<cluster>/<pool>" or "<pool>", for pools '
                    "whose requirements name no instance size (JSON)")
    growth_node_overhead: dict[str, str] = Field(
        default_factory=dict,
        description="what DaemonSets and system pods take of every new node (JSON)")
    growth_max_nodes_per_pool: int = Field(
        default=32, ge=0, description="at most this many nodes that may exist per NodePool")
    growth_stall_after_seconds: float = Field(
        default=600.0, gt=0,
        description="a pod released for growth still unbound this long stalls its cluster's "
                    "growth")
    growth_wave_wait_seconds: float = Field(
        default=60.0, ge=0,
        description="the longest a next wave for growth waits for the last wave's NodeClaims")
    growth_gather_seconds: float = Field(
        default=12.0, ge=0,
        description="releases for growth that fill less than one node of the pool are held, "
                    "owed, at most this long for more to fill it (0: never held)")
    growth_node_groups: list[NodeGroup] = Field(
        default_factory=list,
        description="the cluster-autoscaler's node groups (JSON list of {cluster, name, "
                    "max_size, node_allocatable, node_labels, node_taints})")

    def growth_policy(self) -> GrowthPolicy:
        """How clusters grow (lockgate.growth), in canonical units."""

        def amounts(where: str, quantities: dict[str, str]) -> dict[str, int]:
            try:
                return Resources.from_kubernetes(quantities).as_dict()
            except InvalidQuantityError as error:
                raise ValueError(f"{where}: {error}") from error

        return GrowthPolicy(
            cluster_caps={cluster: amounts(f"growth_cluster_caps[{cluster!r}]", caps)
                          for cluster, caps in self.growth_cluster_caps.items()},
            instance_shapes={pool: amounts(f"growth_instance_shapes[{pool!r}]", shape)
                             for pool, shape in self.growth_instance_shapes.items()},
            node_overhead=amounts("growth_node_overhead", self.growth_node_overhead),
            max_nodes_per_pool=self.growth_max_nodes_per_pool,
            stall_after_seconds=self.growth_stall_after_seconds,
            wave_wait_seconds=self.growth_wave_wait_seconds,
            gather_seconds=self.growth_gather_seconds,
            node_groups=tuple(self.growth_node_groups))

    @model_validator(mode="after")
    def _growth_policy_valid(self) -> SchedulerSettings:
        self.growth_policy()  # a wrong quantity or a group given twice: refused at start
        return self

    # Usage that decays (docs/scheduling.md, "Usage that decays"): off by default, as fairness
    # was (instantaneous). On without a half-life the scheduler refuses to start: never a silent
    # no-op (Kueue's half-life defaulting to 0 turned its feature off without a word).
    history_enabled: bool = Field(
        default=False,
        description="whether each queue's decayed usage lowers its weight among its siblings "
                    "(weight x 2^(-usage / share))")
    history_half_life_seconds: float | None = Field(
        default=None, gt=0,
        description="how fast usage is forgotten: it halves every this long (e.g. 7d); "
                    "required when history is on")
    history_recompute_seconds: float = Field(
        default=60.0, gt=0,
        description="how often the history weights are recomputed; between two changes the "
                    "fair targets (and what preemption converges to) stand still")
    history_weight_tolerance: float = Field(
        default=0.05, ge=0, lt=1,
        description="a recomputation changes the weights in force only if some weight moved "
                    "by more than this fraction (no preemption chasing a drifting target)")
    history_save_seconds: float = Field(
        default=30.0, gt=0,
        description="how often the leader stores the decayed usage in Postgres (and when it "
                    "steps down), for the next leader to restore")

    def history_policy(self) -> HistoryPolicy:
        """Whether usage history counts, and its half-life (lockgate.decayed_usage)."""
        return HistoryPolicy(enabled=self.history_enabled,
                             half_life_seconds=self.history_half_life_seconds)

    @model_validator(mode="after")
    def _history_policy_valid(self) -> SchedulerSettings:
        try:
            self.history_policy()  # on without a half-life: refused at start, with its reason
        except ValueError as error:
            raise ValueError(
                f"{error} (LOCKGATE_SCHEDULER_HISTORY_HALF_LIFE_SECONDS, e.g. 7d; or "
                f"LOCKGATE_SCHEDULER_HISTORY_ENABLED=false)") from error
        return self
