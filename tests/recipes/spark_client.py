"""A Spark driver in client mode on lockgate, as docs/integrations/spark.md describes it: a real
pyspark SparkSession whose executors are pods in an ephemeral namespace, created with the
coordinator's kubeconfig only.

Run with the recipes' clients venv (python -m devstack.clients), not lockgate's:

    KUBECONFIG=coordinator.kubeconfig python spark_client.py --app etl-1 --static 3
    KUBECONFIG=coordinator.kubeconfig python spark_client.py --app etl-1 --dynamic 2 4

It prints `session <application id>` once the SparkSession is up. Then it reads commands, one
a line, on stdin: `job N` submits a job of N tasks in the background (its pending tasks make
dynamic allocation ask for more executors; on kwok no task ever runs, so it never ends). When
stdin closes, or on SIGTERM, it stops the session (Spark deletes its executor pods) and prints
`stopped`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import SparkSession


def kube_server(kubeconfig: Path) -> tuple[str, str]:
    """The current context's apiserver URL and namespace."""
    config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"]
                   if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    return cluster["server"], context.get("namespace", "default")


def lockgate_conf(app: str, *, static: int | None, dynamic: tuple[int, int] | None
                  ) -> dict[str, str]:
    """The executors' pod group (docs/scheduling.md, Gangs and Elastic groups)."""
    label = "spark.kubernetes.executor.label.lockgate.io/group"
    annotation = "spark.kubernetes.executor.annotation.lockgate.io/"
    if static is not None:
        return {label: app, "spark.executor.instances": str(static),
                f"{annotation}group-size": str(static)}
    assert dynamic is not None
    low, high = dynamic
    return {label: app,
            "spark.dynamicAllocation.enabled": "true",
            # No external shuffle service on Kubernetes: Spark keeps executors holding shuffle
            # data itself.
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": str(low),
            "spark.dynamicAllocation.initialExecutors": str(low),
            "spark.dynamicAllocation.maxExecutors": str(high),
            f"{annotation}group-min-size": str(low),
            f"{annotation}group-max-size": str(high)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", required=True, help="the application's name; its group name")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--static", type=int, metavar="N", help="spark.executor.instances")
    mode.add_argument("--dynamic", type=int, nargs=2, metavar=("MIN", "MAX"),
                      help="dynamic allocation's minExecutors and maxExecutors")
    parser.add_argument("--image", default="lockgate.invalid/spark:never-pulled",
                        help="executor image (kwok never pulls it)")
    parser.add_argument("--pod-template", type=Path,
                        help="spark.kubernetes.executor.podTemplateFile")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="more Spark settings")
    args = parser.parse_args()
    kubeconfig = Path(os.environ["KUBECONFIG"])  # fabric8 reads it (Config.autoConfigure)
    server, namespace = kube_server(kubeconfig)

    conf = {
        "spark.app.name": args.app,
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": args.image,
        "spark.kubernetes.executor.podNamePrefix": args.app,
        "spark.executor.cores": "1",
        "spark.kubernetes.executor.request.cores": "1",
        "spark.executor.memory": "512m",
        # The driver runs here; executors would reach it at this address (on kwok none does).
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "512m",
        "spark.ui.enabled": "false",
        **lockgate_conf(args.app, static=args.static,
                        dynamic=tuple(args.dynamic) if args.dynamic else None),
    }
    if args.pod_template:
        conf["spark.kubernetes.executor.podTemplateFile"] = str(args.pod_template)
    for item in args.conf:
        key, _, value = item.partition("=")
        conf[key] = value
    builder = SparkSession.builder.master(f"k8s://{server}")
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    context = session.sparkContext
    context.setLogLevel("WARN")
    print(f"session {context.applicationId}", flush=True)
    print(json.dumps({"conf": conf}), file=sys.stderr, flush=True)

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    def submit(tasks: int) -> None:
        def job() -> None:
            try:
                context.parallelize(range(tasks), tasks).map(lambda x: x).count()
            except Exception as error:  # cancelled when the session stops
                print(f"job ended: {type(error).__name__}", file=sys.stderr, flush=True)

        threading.Thread(target=job, daemon=True, name=f"job-{tasks}").start()
        print(f"submitted {tasks}", flush=True)

    def commands() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["job"]:
                submit(int(words[1]))
        stopping.set()

    threading.Thread(target=commands, daemon=True, name="stdin").start()
    stopping.wait()
    session.stop()  # deletes the executor pods (spark.kubernetes.executor.deleteOnTermination)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
