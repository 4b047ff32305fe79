"""A private Kafka broker whose client listener requires SASL/SCRAM, to prove lockgate's SASL
settings against a real broker.

Why a broker of its own: the shared stack's broker has a PLAINTEXT listener only, and adding one
means restarting it under everyone's tests. This one runs from the same cached jars as the
stack's, in a temporary directory, on free loopback ports, with SCRAM users created when its
storage is formatted; it is stopped (SIGTERM, then SIGKILL) afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from devstack.config import Settings
from devstack.kafka import Kafka, java_bin, new_cluster_id
from devstack.ports import free_port

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class SaslBroker:
    bootstrap: str  # the SASL_PLAINTEXT listener
    username: str
    password: str
    log: Path


@contextlib.asynccontextmanager
async def sasl_broker(directory: Path, *, within: float = 90.0) -> AsyncIterator[SaslBroker]:
    jars = Kafka(Settings.from_env()).jars
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise RuntimeError(f"Kafka's jars are missing in {jars}: bring the stack up first")
    port, internal, controller = free_port(), free_port(), free_port()
    username, password = "lockgate-test", uuid.uuid4().hex
    scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller}",
        "listeners": (f"SASL_PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},"
                      f"CONTROLLER://127.0.0.1:{controller}"),
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map":
            "CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        **{f"listener.name.sasl_plaintext.{m.lower()}.sasl.jaas.config": scram_jaas
           for m in MECHANISMS},
        "log.dirs": str(directory / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "1",
        "num.io.threads": "2",
    }
    properties = directory / "server.properties"
    properties.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log = directory / "kafka.log"
    java = [java_bin(), "-Xmx256m", "-Xms64m", "-cp", f"{jars}/*"]
    cluster_id = new_cluster_id()
    scram = [arg for m in MECHANISMS
             for arg in ("--add-scram", f"{m}=[name={username},password={password}]")]
    with _append(log) as output:
        formatting = await asyncio.create_subprocess_exec(
            *java, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id,
            "-c", str(properties), *scram, stdout=output, stderr=subprocess.STDOUT)
        formatted = await formatting.wait()
    if formatted != 0:
        raise RuntimeError(f"formatting the SASL broker's storage failed; log {log}:\n"
                           + _tail(log))
    with _append(log) as output:  # the child keeps its own descriptor
        broker = await asyncio.create_subprocess_exec(
            *java, "kafka.Kafka", str(properties), stdout=output,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        await _wait_listening(port, broker, log, within)
        yield SaslBroker(f"127.0.0.1:{port}", username, password, log)
    finally:
        if broker.returncode is None:
            broker.terminate()
            try:
                await asyncio.wait_for(broker.wait(), 30)
            except TimeoutError:
                broker.kill()
                await broker.wait()


async def _wait_listening(port: int, broker: asyncio.subprocess.Process, log: Path,
                          within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if broker.returncode is not None:
            raise RuntimeError(f"the SASL broker exited ({broker.returncode}); log {log}:\n"
                               + _tail(log))
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"the SASL broker did not listen within {within:.0f}s; log {log}")
        await asyncio.sleep(0.2)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


def _append(log: Path) -> BinaryIO:
    return log.open("ab")
