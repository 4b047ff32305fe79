"""A single-node Apache Kafka (KRaft) broker from Maven Central jars."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import struct
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

from devstack.config import HOST, LOG4J_VERSION, SLF4J_VERSION, Settings
from devstack.errors import StackError
from devstack.procs import Component, exclusive, tail

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.lockgate</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <!-- kafka brings slf4j-api 1.7; the slf4j2 binding needs the 2.x API (compatible). -->
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version>
    </dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = warn
name = lockgate-kafka
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.groups.name = org.apache.kafka.coordinator.group
logger.groups.level = WARN
"""


def new_cluster_id() -> str:
    """A random KRaft cluster id, as `kafka-storage random-uuid` gives: 22 url-safe base64
    characters, never starting with "-" (the storage tool would read it as a flag)."""
    while True:
        raw = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not raw.startswith("-"):
            return raw


def java_bin() -> str:
    java = shutil.which("java")
    if java is None:
        home = os.environ.get("JAVA_HOME")
        if home and (Path(home) / "bin" / "java").exists():
            return str(Path(home) / "bin" / "java")
        raise StackError(
            "Java is missing: Kafka needs Java 17 or newer. Install it "
            "(`apt-get install -y openjdk-17-jre-headless`) or set JAVA_HOME, then run `up` again."
        )
    return java


class Kafka:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.dist = settings.kafka_dist_dir
        self.jars = self.dist / "jars"
        self.dir = settings.stack_dir / "kafka"
        self.props = self.dir / "server.properties"
        self.data = self.dir / "data"

    # -- install --
    def installed(self) -> bool:
        return (self.dist / ".complete").exists() and any(self.jars.glob("kafka_2.13-*.jar"))

    def ensure_installed(self, say: Callable[[str], None]) -> None:
        if self.installed():
            return
        self.dist.mkdir(parents=True, exist_ok=True)
        # One download at a time: two devstacks starting together (helpers' stacks, a
        # fresh-check beside a running stack) would both write Maven's local repository, whose
        # half-written `.part` files the other then fails on.
        with exclusive(self.dist.with_suffix(".lock"), say,
                       "another devstack is downloading Kafka's jars"):
            if not self.installed():
                self._download(say)

    def _download(self, say: Callable[[str], None]) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError(
                "Maven is missing: it downloads Kafka's jars from Maven Central. "
                "Install it (`apt-get install -y maven`), then run `up` again."
            )
        java_bin()
        self.dist.mkdir(parents=True, exist_ok=True)
        log = self.s.cache_logs_dir / f"kafka-download-{self.s.kafka_version}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        (self.dist / "pom.xml").write_text(
            _POM.format(kafka=self.s.kafka_version, log4j=LOG4J_VERSION, slf4j=SLF4J_VERSION)
        )
        tmp = self.dist / "jars.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        say(f"downloading Kafka {self.s.kafka_version} jars from Maven Central (log {log})")
        with open(log, "wb") as logf:
            rc = subprocess.call(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-f",
                    str(self.dist / "pom.xml"),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={tmp}",
                    "-DincludeScope=runtime",
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if rc != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
            raise StackError(
                f"downloading Kafka's jars failed (mvn exit {rc}); log {log}:\n{tail(log)}"
            )
        shutil.rmtree(self.jars, ignore_errors=True)
        tmp.replace(self.jars)
        (self.dist / ".complete").write_text(self.s.kafka_version + "\n")

    # -- configure --
    def prepare(self, say: Callable[[str], None]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        s = self.s
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{HOST}:{s.kafka_controller_port}",
            "listeners": (
                f"PLAINTEXT://{HOST}:{s.kafka_port},CONTROLLER://{HOST}:{s.kafka_controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{HOST}:{s.kafka_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "4",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.retention.hours": "24",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "delete.topic.enable": "true",
        }
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        if not self.props.exists() or self.props.read_text() != text:
            self.props.write_text(text)
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        if not (self.data / "meta.properties").exists():
            self._format(say)

    def _format(self, say: Callable[[str], None]) -> None:
        id_file = self.dir / "cluster-id"
        # An id from before new_cluster_id() may start with "-", which the tool reads as a flag.
        if not id_file.exists() or id_file.read_text().startswith("-"):
            id_file.write_text(new_cluster_id() + "\n")
        cluster_id = id_file.read_text().strip()
        log = self.s.logs_dir / "kafka-format.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        say(f"formatting Kafka storage in {self.data}")
        with open(log, "wb") as logf:
            rc = subprocess.call(
                [
                    java_bin(),
                    "-Xmx256m",
                    f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                    "-cp",
                    f"{self.jars}/*",
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self.props),
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if rc != 0:
            raise StackError(
                f"formatting Kafka storage failed (exit {rc}); log {log}:\n{tail(log)}"
            )

    def component(self) -> Component:
        s = self.s
        return Component(
            name="kafka",
            argv=[
                shutil.which("java") or "java",
                f"-Xmx{s.kafka_heap}",
                "-Xms128m",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-XX:+ExitOnOutOfMemoryError",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={s.logs_dir}",
                "-cp",
                f"{self.jars}/*",
                "kafka.Kafka",
                str(self.props),
            ],
            cwd=self.dir,
            ports=[s.kafka_port, s.kafka_controller_port],
            endpoint=f"{HOST}:{s.kafka_port}",
            health=lambda: broker_health(HOST, s.kafka_port),
            stop_timeout=30.0,
        )


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return buf


def broker_health(host: str, port: int) -> str | None:
    """Asks the broker for metadata (Metadata v4) and checks that it lists a broker."""
    client_id = b"devstack"
    # header: api_key=3 (Metadata), api_version=4, correlation_id, client_id
    header = struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id
    body = struct.pack(">i?", -1, False)  # topics=null (all), allow_auto_topic_creation=false
    msg = header + body
    try:
        with socket.create_connection((host, port), timeout=2.0) as sock:
            sock.settimeout(2.0)
            sock.sendall(struct.pack(">i", len(msg)) + msg)
            (size,) = struct.unpack(">i", _read_exact(sock, 4))
            resp = _read_exact(sock, size)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    corr, _throttle, n_brokers = struct.unpack(">iii", resp[:12])
    if corr != 7:
        return "unexpected Metadata response"
    return None if n_brokers > 0 else "broker not registered yet"
