"""The whole local stack: bring it up, report on it, take it down.

Autoscaled clusters (config.AUTOSCALED_CLUSTERS, e.g. cluster-c): a control plane with no node
and Karpenter against it, only when asked (`up --autoscaled cluster-c`, or
LOCKGATE_AUTOSCALED_CLUSTERS). The stack records them (file `autoscaled-clusters` in the stack
dir) from the `up` that asked until `down`, so `status`, `down` and later `up`s include them.
Asking on a running stack starts only what is missing; nothing else restarts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import yaml

from devstack import base, gobuild
from devstack.config import AUTOSCALED_CLUSTERS, CLUSTERS, Settings, autoscaled_names
from devstack.errors import StackError
from devstack.jaeger import JaegerPorts
from devstack.kafka import Kafka, java_bin
from devstack.kube import Cluster
from devstack.ports import COMPOSE_PORTS, COMPOSE_WEBHOOK_PORTS, TILT_PORT_SHIFT, ServicePorts
from devstack.postgres import Postgres
from devstack.procs import (
    Component,
    Processes,
    pid_alive,
    port_busy,
    port_owner,
    reserve_ports,
    wait_healthy,
    wait_while_only_connections_hold,
)

_MARKER = ".lockgate-stack"
_AUTOSCALED_RECORD = "autoscaled-clusters"
# A stack started right after another stopped may find one of its ports taken by a client
# connection that is closing (before the ports were reserved): wait out that connection.
PORT_HELD_BY_CONNECTIONS_WAIT_SECONDS = 90.0


def launcher_ports(offset: int) -> list[int]:
    """The fixed loopback ports that what runs beside the stack at this offset binds: `make
    run`'s services and its Jaeger, Tilt's services and `make compose-up`'s containers and
    webhooks. They lie in the kernel's ephemeral range like the stack's own, and a service that
    finds its port taken by an outgoing connection cannot start (a `make run` that followed
    other tests once found its Jaeger's port so taken; a crash-looping compose container would
    look the same).
    """
    jaeger = JaegerPorts.with_offset(offset)
    ports = ServicePorts.shifted(offset).all()  # make run
    ports += ServicePorts.shifted(offset + TILT_PORT_SHIFT).all()  # Tilt
    ports += [jaeger.otlp_http, jaeger.query_http, jaeger.query_grpc]
    ports += [port + offset for port in COMPOSE_PORTS.values()]
    ports += [port + offset for pair in COMPOSE_WEBHOOK_PORTS.values() for port in pair]
    return sorted(set(ports))


@dataclass(frozen=True)
class StackInfo:
    """Where the running stack's services are."""

    kubeconfigs: dict[str, str]
    kafka_bootstrap: str
    postgres_dsn: str
    stack_dir: str = field(default="")
    # identity ("cluster-watcher", "ungater", "webhook", "queue-sync") → cluster → kubeconfig
    # with that identity's ServiceAccount token (k8s/base); `kubeconfigs` are admin's.
    identity_kubeconfigs: dict[str, dict[str, str]] = field(default_factory=dict)
    # The autoscaled clusters (devstack.karpenter) that run, apart: a run that names no clusters
    # gets the fixed-size ones only. `including_autoscaled()` adds them to the fields above.
    autoscaled_kubeconfigs: dict[str, str] = field(default_factory=dict)
    autoscaled_identity_kubeconfigs: dict[str, dict[str, str]] = field(default_factory=dict)

    def including_autoscaled(self) -> StackInfo:
        """This stack with its autoscaled clusters among `kubeconfigs` and the identities', for
        a run that names them (`Lockgate.for_stack(info, clusters={...: "cluster-c"})`)."""
        identities = {
            identity: {**own, **self.autoscaled_identity_kubeconfigs.get(identity, {})}
            for identity, own in self.identity_kubeconfigs.items()
        }
        return StackInfo(
            kubeconfigs={**self.kubeconfigs, **self.autoscaled_kubeconfigs},
            kafka_bootstrap=self.kafka_bootstrap, postgres_dsn=self.postgres_dsn,
            stack_dir=self.stack_dir, identity_kubeconfigs=identities,
            autoscaled_kubeconfigs=dict(self.autoscaled_kubeconfigs),
            autoscaled_identity_kubeconfigs=self.autoscaled_identity_kubeconfigs)

    def kubeconfigs_of(self, identity: str,
                       clusters: Mapping[str, str] | None = None) -> dict[str, str]:
        """cluster → kubeconfig of `identity`; `clusters` (name → real cluster) renames them."""
        if identity not in self.identity_kubeconfigs:
            raise KeyError(f"no identity {identity!r}; known: "
                           f"{', '.join(sorted(self.identity_kubeconfigs))}")
        own = self.identity_kubeconfigs[identity]
        if clusters is None:
            return dict(own)
        return {name: own[real] for name, real in clusters.items()}

    def env(self) -> dict[str, str]:
        """The LOCKGATE_* environment variables that point at this stack."""
        out = {
            f"LOCKGATE_KUBECONFIG_{name.upper().replace('-', '_')}": path
            for name, path in sorted(self.kubeconfigs.items())
        }
        out.update({
            f"LOCKGATE_AUTOSCALED_KUBECONFIG_{name.upper().replace('-', '_')}": path
            for name, path in sorted(self.autoscaled_kubeconfigs.items())
        })
        out["LOCKGATE_KAFKA_BOOTSTRAP"] = self.kafka_bootstrap
        out["LOCKGATE_POSTGRES_DSN"] = self.postgres_dsn
        out["LOCKGATE_STACK_DIR"] = self.stack_dir
        return out


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Stack:
    def __init__(self, settings: Settings | None = None, say: Callable[[str], None] = _stderr,
                 *, announce_env: bool = True, autoscaled: Iterable[str] = ()):
        """`announce_env`: whether the summary tells to source the stack's env file (`make run`
        prints its own, which has the stack's variables too). `autoscaled`: autoscaled clusters
        to add (besides those LOCKGATE_AUTOSCALED_CLUSTERS names and those already recorded)."""
        self.s = settings or Settings.from_env()
        self.say = say
        self.announce_env = announce_env
        self.procs = Processes(self.s.run_dir, self.s.logs_dir)
        self.postgres = Postgres(self.s)
        self.kafka = Kafka(self.s)
        self.clusters = [Cluster(self.s, name) for name in CLUSTERS]
        wanted = {*autoscaled_names(autoscaled, "--autoscaled"), *self.s.autoscaled_requested,
                  *self._recorded_autoscaled()}
        self.autoscaled_clusters = [Cluster(self.s, name) for name in AUTOSCALED_CLUSTERS
                                    if name in wanted]

    @property
    def all_clusters(self) -> list[Cluster]:
        return self.clusters + self.autoscaled_clusters

    def _recorded_autoscaled(self) -> tuple[str, ...]:
        try:
            text = (self.s.stack_dir / _AUTOSCALED_RECORD).read_text()
        except FileNotFoundError:
            return ()
        return autoscaled_names(text.split(), str(self.s.stack_dir / _AUTOSCALED_RECORD))

    def _record_autoscaled(self) -> None:
        path = self.s.stack_dir / _AUTOSCALED_RECORD
        names = sorted(c.name for c in self.autoscaled_clusters)
        if names:
            path.write_text("".join(f"{name}\n" for name in names))
        else:
            path.unlink(missing_ok=True)

    # -- description --
    def info(self) -> StackInfo:
        def identities(clusters: list[Cluster]) -> dict[str, dict[str, str]]:
            return {identity: {c.name: str(base.identity_kubeconfig(c, identity))
                               for c in clusters}
                    for identity in base.IDENTITIES}

        return StackInfo(
            kubeconfigs={c.name: str(c.kubeconfig) for c in self.clusters},
            kafka_bootstrap=self.s.kafka_bootstrap,
            postgres_dsn=self.s.postgres_dsn,
            stack_dir=str(self.s.stack_dir),
            identity_kubeconfigs=identities(self.clusters),
            autoscaled_kubeconfigs={c.name: str(c.kubeconfig) for c in self.autoscaled_clusters},
            autoscaled_identity_kubeconfigs=(identities(self.autoscaled_clusters)
                                             if self.autoscaled_clusters else {}),
        )

    def components(self) -> list[Component]:
        comps = [self.postgres.component(), self.kafka.component()]
        for c in self.all_clusters:
            comps += c.components()
        return comps

    def _by_kind(self, comps: list[Component], *kinds: str) -> list[Component]:
        return [c for c in comps if c.name.rsplit("/", 1)[-1] in kinds]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.s.stack_dir.mkdir(parents=True, exist_ok=True)
        with open(self.s.stack_dir / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.say("another devstack command holds the stack lock; waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # -- health --
    def problems(self) -> list[str]:
        """Empty when every component runs and answers, and the clusters are ready."""
        out = []
        for comp in self.components():
            st = self.procs.inspect(comp)
            if st.state != "running":
                out.append(f"{comp.name}: {st.state} {st.detail}".rstrip())
                continue
            reason = comp.health()
            if reason is not None:
                out.append(f"{comp.name}: unhealthy ({reason})")
        if out:
            return out
        reason = self.postgres.query_ok("lockgate")
        if reason is not None:
            out.append(f"postgres: database lockgate: {reason}")
        for c in self.all_clusters:
            reason = c.readiness()
            if reason is not None:
                out.append(f"{c.name}: {reason}")
        return out

    # -- commands --
    def build(self) -> None:
        """Installs and builds everything missing, without starting anything."""
        java_bin()
        gobuild.ensure_binaries(self.s, self.say)
        self.kafka.ensure_installed(self.say)
        self.postgres.ensure_installed(self.say)
        if self.autoscaled_clusters:
            # Imported here, as in karpenter_crds.
            from devstack.karpenter import ensure_karpenter

            ensure_karpenter(self.s, self.say)

    def up(self) -> StackInfo:
        started = time.monotonic()
        with self._locked():
            all_ports = [port for comp in self.components() for port in comp.ports]
            all_ports += launcher_ports(self.s.postgres_port - 55432)
            if reserve_ports(all_ports):
                self.say(
                    "reserved the stack's ports (and those `make run`, Tilt and `make compose-up` "
                    "bind beside it) in net.ipv4.ip_local_reserved_ports so outgoing "
                    "connections never take them (until reboot)"
                )
            if self.autoscaled_clusters:
                self._record_autoscaled()
            if not self.problems():
                self.install_cluster_objects()
                self._summary(f"already up (checked in {time.monotonic() - started:.1f}s)")
                return self.info()
            (self.s.stack_dir / _MARKER).touch()
            # Ports first: a clash is reported before anything is installed or initialised.
            names_to_start = {c.name for c in self._check_before_start(self.components())}
            self.build()
            self.postgres.prepare(self.say)
            self.kafka.prepare(self.say)
            for c in self.all_clusters:
                c.prepare()
            comps = self.components()
            to_start = [c for c in comps if c.name in names_to_start]

            def start(group: list[Component]) -> None:
                for comp in group:
                    if comp in to_start:
                        self.procs.start(comp)

            timeout = self.s.timeout
            etcds = self._by_kind(comps, "etcd")
            apiservers = self._by_kind(comps, "kube-apiserver")
            rest = self._by_kind(comps, "kube-controller-manager", "kube-scheduler", "kwok")
            services = self._by_kind(comps, "postgres", "kafka")
            if to_start:
                self.say(f"starting {', '.join(c.name for c in to_start)}")
            phases: list[str] = []
            mark = started

            def phase(name: str) -> None:
                nonlocal mark
                now = time.monotonic()
                phases.append(f"{name} {now - mark:.1f}s")
                mark = now

            phase("install+prepare")
            start(services + etcds)
            wait_healthy(etcds, self.procs, timeout)
            phase("etcd")
            start(apiservers)
            wait_healthy(apiservers, self.procs, timeout)
            phase("apiservers")
            for cluster, kwok in zip(self.all_clusters, self._by_kind(comps, "kwok"),
                                     strict=True):
                if kwok in to_start:
                    cluster.release_node_leases()
            start(rest)
            for c in self.all_clusters:
                c.ensure_nodes()
            wait_healthy(services + rest, self.procs, timeout)
            self.postgres.bootstrap()
            phase("controllers+kafka+postgres")
            wait_healthy(
                [],
                self.procs,
                timeout,
                extra={f"{c.name} nodes and service accounts": c.readiness
                       for c in self.all_clusters},
            )
            phase("nodes")
            self.install_cluster_objects()
            phase("k8s/base")
            karpenters = self._by_kind(comps, "karpenter")
            if karpenters:
                # Karpenter's readiness waits for the NodePool and NodeClaim CRDs: apply first.
                for cluster in self.autoscaled_clusters:
                    base.apply_objects(cluster, karpenter_crds(self.s))
                start(karpenters)
                wait_healthy(karpenters, self.procs, timeout)
                phase("karpenter")
            self._write_env_file()
            total = time.monotonic() - started
            self._summary(f"up in {total:.1f}s ({', '.join(phases)})")
            return self.info()

    def install_cluster_objects(self) -> StackInfo:
        """Applies k8s/base to each cluster (server-side apply, idempotent) and writes a
        kubeconfig per lockgate identity with its ServiceAccount's token."""
        # Certificates and kubeconfigs of an older format (devstack.pki) are rewritten, also on
        # a running stack: the same CA reissues them, and the running components trust the CA.
        for cluster in self.all_clusters:
            cluster.prepare()
        for line in base.install(self.all_clusters):
            self.say(line)
        return self.info()

    def _check_before_start(self, comps: list[Component]) -> list[Component]:
        to_start = []
        for comp in comps:
            self.procs.clear_stale(comp, self.say)
            st = self.procs.inspect(comp)
            if st.state == "running":
                rec = self.procs.read(comp)
                if rec is not None and rec.argv != comp.argv:
                    self.say(
                        f"note: {comp.name} (pid {st.pid}) runs with other settings than this "
                        "devstack would use; `python -m devstack down` then `up` applies them"
                    )
                continue
            for port in comp.ports:
                if port_busy(port) and not wait_while_only_connections_hold(
                        port, PORT_HELD_BY_CONNECTIONS_WAIT_SECONDS, self.say):
                    raise StackError(
                        f"port {port} (for {comp.name}) is already in use by {port_owner(port)}, "
                        "which this stack did not start. Stop that process, or give this stack "
                        "other ports with LOCKGATE_STACK_PORT_OFFSET=<n> (added to every port)."
                    )
            to_start.append(comp)
        return to_start

    def down(self, purge: bool = False) -> None:
        with self._locked():
            comps = self.components()
            tiers = [
                self._by_kind(comps, "karpenter"),
                self._by_kind(comps, "kwok", "kube-scheduler", "kube-controller-manager"),
                self._by_kind(comps, "kube-apiserver"),
                self._by_kind(comps, "etcd", "kafka", "postgres"),
            ]
            for tier in tiers:
                stopping = []
                for comp in tier:
                    pid = self.procs.inspect(comp).pid
                    if self.procs.stop(comp, self.say):
                        stopping.append((comp, pid))
                if not stopping:
                    continue
                deadline = time.monotonic() + max(c.stop_timeout for c, _ in stopping)
                for comp, pid in stopping:
                    self.procs.wait_stopped(comp, deadline, self.say)
                    self.say(f"stopped {comp.name} (pid {pid})")
            # Autoscaled clusters last until `down`: a later plain `up` is the fixed-size stack.
            (self.s.stack_dir / _AUTOSCALED_RECORD).unlink(missing_ok=True)
            if purge:
                self._purge()

    def _purge(self) -> None:
        self.postgres.purge()
        d = self.s.stack_dir
        names = ["logs", "run", "postgres", "kafka", "env.sh", ".lock", _MARKER, *CLUSTERS,
                 *AUTOSCALED_CLUSTERS]
        for name in names:
            p = d / name
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)
        with contextlib.suppress(OSError):
            d.rmdir()
        self.say(f"purged {d}")

    def status(self) -> tuple[list[str], bool]:
        ok = True
        lines = []
        for comp in self.components():
            st = self.procs.inspect(comp)
            if st.state == "running":
                reason = comp.health()
                state = "running" if reason is None else "unhealthy"
                note = "" if reason is None else f"  ({reason})"
            else:
                state, note = "stopped", (f"  (stale pid file: {st.detail})" if st.detail else "")
            ok = ok and state == "running"
            pid = str(st.pid) if st.pid and st.state == "running" else "-"
            lines.append(
                f"{comp.name:<34} {state:<9} pid {pid:<7} {comp.endpoint:<26} "
                f"log {self.procs.log_path(comp)}{note}"
            )
        for c in self.all_clusters:
            apiserver = self._by_kind(c.components(), "kube-apiserver")[0]
            if self.procs.inspect(apiserver).state == "running":
                reason = c.readiness()
                lines.append(
                    f"{c.name + '/nodes':<34} {c.nodes_summary()}"
                    + ("" if reason is None else f"  (not ready: {reason})")
                )
                ok = ok and reason is None
        return lines, ok

    # -- one component: outage tests kill a dependency and bring it back --
    def component(self, name: str) -> Component:
        """A component by name: `postgres`, `kafka`, `cluster-a/etcd`, `cluster-b/kwok`..."""
        for comp in self.components():
            if comp.name == name:
                return comp
        known = ", ".join(c.name for c in self.components())
        raise StackError(f"no component {name!r} in the stack (components: {known})")

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one running component of this stack (SIGKILL: a crash) and wait until it is
        gone; returns its pid. Only a process the stack started is ever signalled."""
        comp = self.component(name)
        st = self.procs.inspect(comp)
        if st.state != "running" or st.pid is None:
            raise StackError(f"{name} is not running ({st.state} {st.detail})".rstrip())
        os.kill(st.pid, sig)
        deadline = time.monotonic() + comp.stop_timeout
        while pid_alive(st.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(st.pid):
            raise StackError(f"{name} (pid {st.pid}) still runs {comp.stop_timeout:.0f}s after "
                             f"{sig.name}")
        self.procs.pid_path(comp).unlink(missing_ok=True)
        self.say(f"killed {name} (pid {st.pid}) with {sig.name}")
        return st.pid

    def start_component(self, name: str) -> None:
        """Start one component again if it does not run, and wait until it is healthy."""
        comp = self.component(name)
        with self._locked():
            self.procs.clear_stale(comp, self.say)
            if self.procs.inspect(comp).state != "running":
                self._check_before_start([comp])
                pid = self.procs.start(comp)
                self.say(f"started {name} (pid {pid})")
            wait_healthy([comp], self.procs, self.s.timeout)

    def env_lines(self) -> list[str]:
        return [f"export {k}={shlex.quote(v)}" for k, v in self.info().env().items()]

    def _write_env_file(self) -> None:
        path = self.s.stack_dir / "env.sh"
        path.write_text("\n".join(self.env_lines()) + "\n")

    def _summary(self, headline: str) -> None:
        info = self.info()
        out = [f"lockgate stack {headline}"]
        out.append(f"  postgres   {info.postgres_dsn}")
        out.append(f"  kafka      {info.kafka_bootstrap}")
        for c in self.all_clusters:
            grows = "  (autoscaled: no node until Karpenter makes one)" if c.autoscaled else ""
            out.append(f"  {c.name:<10} {c.server}  kubeconfig {c.kubeconfig}{grows}")
        out.append(f"  logs       {self.s.logs_dir}")
        if self.announce_env:
            out.append(f"  env        source {self.s.stack_dir / 'env.sh'}")
        print("\n".join(out), flush=True)


def stack_info(settings: Settings | None = None) -> StackInfo:
    """Where the stack's services are (whether or not it is running)."""
    return Stack(settings).info()


def karpenter_crds(settings: Settings) -> list[dict[str, object]]:
    """The CRDs Karpenter's kwok provider needs (NodePool, NodeClaim, KWOKNodeClass), from the
    directory it was built into."""
    # Imported here: `python -m devstack.karpenter` runs that module as __main__, which the
    # package (devstack/__init__ imports this module) must not have imported already.
    from devstack.karpenter import CRDS, karpenter_dir

    home = karpenter_dir(settings)
    crds = []
    for name in CRDS:
        try:
            crds.append(yaml.safe_load((home / name).read_text()))
        except OSError as exc:
            raise StackError(f"Karpenter's CRD {name} is missing from {home} ({exc}); "
                             "`python -m devstack.karpenter` builds it") from exc
    return crds


def ensure_up(settings: Settings | None = None, *,
              autoscaled: Iterable[str] = ()) -> StackInfo:
    """Returns the running stack if it is healthy; otherwise brings it up (raises StackError).
    `autoscaled`: autoscaled clusters it must have too (started if missing, nothing else
    restarted)."""
    stack = Stack(settings, autoscaled=autoscaled)
    if not stack.problems():
        # Cheap and idempotent; the files may have changed since the stack came up.
        return stack.install_cluster_objects()
    return stack.up()


def install_cluster_objects(settings: Settings | None = None) -> StackInfo:
    """Applies k8s/base to the running stack's clusters and refreshes the identities'
    kubeconfigs (what `up` does last); raises StackError."""
    return Stack(settings).install_cluster_objects()
