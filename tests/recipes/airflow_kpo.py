"""One Airflow DAG run of one KubernetesPodOperator task, run the way Airflow runs it but without
a scheduler: `dag.test()` (Airflow 3's in-process run: the scheduler's dependency checks, retries
after `retry_delay` included, and each try through the Task SDK's in-process supervisor, so the
operator's `execute`, its failure, `on_retry_callback` and the next try are Airflow's own), with
a SQLite metadata DB in a fresh AIRFLOW_HOME. Run with the Airflow venv's python
(`python -m devstack.clients airflow`), against a kubeconfig given on the command line (a
non-admin identity's):

    python airflow_kpo.py --kubeconfig K --namespace NS --queue Q --name POD \
        --schedule-timeout 30 --retry-delay 3 [--cpu 2] [--complete-after 3s] \
        [--node-selector k=v] [--toleration k=v]

The task is docs/integrations/airflow.md's: `schedule_timeout_seconds` short here (on purpose),
`retries=1`, the pod named POD with `random_name_suffix=False` (so a retry creates the pod of the
same name: the same work, for lockgate), `on_finish_action="delete_pod"`. kwok runs no container:
the pod carries lockgate.io/complete-after, after which the stack's kwok marks it Succeeded; so
`get_logs=False` (no container to read) and `do_xcom_push=False` (no sidecar to exec into).

Prints one JSON line per thing that happened, as it happens, `{"event": ...}` (and nothing else on
stdout: Airflow's own logs go to stderr):
- "created": a try created its pod (`try`, `pod`, `uid`);
- "cleaned": the try's cleanup ran to its end (`try`, `pod`, `uid`, `gone`: whether the pod was
  deleted; a try that failed raises out of its cleanup before this callback, so it has none);
- "retry": a try failed and Airflow will retry it (`try`, `exceptions`: the exception and those
  it arose from, `pod`, `gone`: whether the try's pod was deleted);
and last, `{"outcome": "success" | "failed", "tries": [{"try", "state"}, ...], "seconds"}`.
Exit status 0 when the DAG run succeeded, 1 otherwise.

The same file is the DAG file: the run copies it into its DAGS_FOLDER, where Airflow parses it
(dag.test() records the DAG from its bundle), and the DAG's settings come from the environment
this script sets (LOCKGATE_KPO_*).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

DAG_ID = "lockgate_kpo"
TASK_ID = "work"
SETTINGS = "LOCKGATE_KPO_SETTINGS"  # the DAG's settings, JSON, set by main()
EVENTS = "LOCKGATE_KPO_EVENTS"  # where the callbacks append their lines


def record(event: dict[str, Any]) -> None:
    """A line for the caller: into the events file (the task's stdout is Airflow's log)."""
    with open(os.environ[EVENTS], "a") as out:
        out.write(json.dumps(event) + "\n")


def build_dag(settings: dict[str, Any]) -> Any:
    """The DAG: one KubernetesPodOperator task, configured as docs/integrations/airflow.md says."""
    from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk import DAG
    from kubernetes.client import CoreV1Api
    from kubernetes.client import models as k8s
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import new_client_from_config

    class Report(KubernetesPodOperatorCallback):
        """What each try did with its pod, for the caller (Airflow's callback hooks)."""

        @staticmethod
        def on_pod_creation(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
            context = kwargs.get("context") or {}
            ti = context.get("ti")
            record({"event": "created", "try": getattr(ti, "try_number", None),
                    "pod": pod.metadata.name if pod else None,
                    "uid": pod.metadata.uid if pod else None})

        @staticmethod
        def on_pod_cleanup(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
            context = kwargs.get("context") or {}
            ti = context.get("ti")
            gone: bool | None
            try:
                remote = client.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
                gone = remote.metadata.deletion_timestamp is not None
                uid = remote.metadata.uid
            except ApiException as error:
                gone, uid = (True, None) if error.status == 404 else (None, None)
            except Exception:  # a report, not the task: never fail the cleanup
                gone, uid = None, None
            record({"event": "cleaned", "try": getattr(ti, "try_number", None),
                    "pod": pod.metadata.name, "uid": uid, "gone": gone})

    def on_retry(context: Any) -> None:
        """The try failed and will be retried: why (the exception and those it arose from: a
        schedule timeout surfaces as the cleanup's "Pod ... returned a failure", raised while
        handling PodLaunchTimeoutException), and whether the try's pod is gone."""
        error = context.get("exception")
        chain: list[str] = []
        while error is not None and len(chain) < 5:
            chain.append(f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
            error = error.__cause__ or error.__context__
        api = CoreV1Api(new_client_from_config(settings["kubeconfig"]))
        try:
            pod = api.read_namespaced_pod(settings["name"], settings["namespace"])
            gone = pod.metadata.deletion_timestamp is not None
        except ApiException as missing:
            gone = missing.status == 404
        record({"event": "retry", "try": context["ti"].try_number, "exceptions": chain,
                "pod": settings["name"], "gone": gone})

    toleration = [k8s.V1Toleration(key=key, operator="Equal", value=value, effect="NoSchedule")
                  for key, value in (pair.split("=", 1) for pair in settings["tolerations"])]
    with DAG(DAG_ID, schedule=None, catchup=False) as dag:
        KubernetesPodOperator(
            task_id=TASK_ID,
            # Where: the lockgate-managed namespace bound to the queue, and the queue's label.
            config_file=settings["kubeconfig"],
            in_cluster=False,
            namespace=settings["namespace"],
            labels={"lockgate.io/queue": settings["queue"]},
            # The pod: the same name on every try, so a retry is the same work for lockgate.
            name=settings["name"],
            random_name_suffix=False,
            image="busybox:1.36",
            cmds=["true"],
            container_resources=k8s.V1ResourceRequirements(
                requests={"cpu": settings["cpu"], "memory": "64Mi"}),
            node_selector=settings["node_selector"] or None,
            tolerations=toleration or None,
            # kwok: the stack's stages mark the pod Succeeded after this long once it runs.
            annotations={"lockgate.io/complete-after": settings["complete_after"]},
            # Waiting in line: give up after this long (short here on purpose), delete the pod,
            # and let the retry create it again within lockgate's grace period.
            schedule_timeout_seconds=settings["schedule_timeout"],
            startup_timeout_seconds=120,
            on_finish_action="delete_pod",
            retries=1,
            retry_delay=timedelta(seconds=settings["retry_delay"]),
            on_retry_callback=on_retry,
            # kwok runs no container: no logs to follow, no XCom sidecar to read.
            get_logs=False,
            do_xcom_push=False,
            callbacks=Report,
        )
    return dag


if SETTINGS in os.environ:  # parsed by Airflow from the run's DAGS_FOLDER
    dag = build_dag(json.loads(os.environ[SETTINGS]))


def airflow_home(args: argparse.Namespace, home: Path) -> dict[str, str]:
    """The environment of an offline Airflow: SQLite in `home`, no examples, the DAG folder
    holding this file alone, and the DAG's settings."""
    dags = home / "dags"
    dags.mkdir(parents=True)
    shutil.copy(__file__, dags / "lockgate_kpo_dag.py")
    settings = {
        "kubeconfig": args.kubeconfig, "namespace": args.namespace, "queue": args.queue,
        "name": args.name, "cpu": args.cpu, "complete_after": args.complete_after,
        "schedule_timeout": args.schedule_timeout, "retry_delay": args.retry_delay,
        "node_selector": dict(pair.split("=", 1) for pair in args.node_selector),
        "tolerations": args.toleration,
    }
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        SETTINGS: json.dumps(settings),
        EVENTS: str(home / "events.jsonl"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--name", required=True, help="the pod's name, on every try")
    parser.add_argument("--schedule-timeout", type=int, required=True)
    parser.add_argument("--retry-delay", type=int, default=3)
    parser.add_argument("--cpu", default="1")
    parser.add_argument("--complete-after", default="3s")
    parser.add_argument("--node-selector", action="append", default=[])
    parser.add_argument("--toleration", action="append", default=[])
    parser.add_argument("--home", help="AIRFLOW_HOME (default: a new temporary directory)")
    args = parser.parse_args()

    # The report goes to the stdout this process was given: a running task's stdout is
    # Airflow's (its task log), so the lines are written to a duplicate of it made first.
    report = os.dup(1)
    os.dup2(2, 1)  # and everything else written to stdout (Airflow's logs) goes to stderr

    def say(line: str) -> None:
        os.write(report, (line + "\n").encode())

    home = Path(args.home or tempfile.mkdtemp(prefix="lockgate-airflow-"))
    os.environ.update(airflow_home(args, home))
    started = time.monotonic()
    migrated = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"],
                              capture_output=True, text=True, check=False)
    if migrated.returncode != 0:
        print(migrated.stdout[-2000:] + migrated.stderr[-4000:], file=sys.stderr)
        say(json.dumps({"outcome": "no-db", "seconds": round(time.monotonic() - started, 1)}))
        return 1
    say(json.dumps({"event": "db", "seconds": round(time.monotonic() - started, 1)}))

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session

    events = Path(os.environ[EVENTS])
    events.touch()
    shown = 0

    # dag.test() blocks until the run ends; the callbacks' lines are passed on as they come.
    done = threading.Event()

    def relay() -> None:
        nonlocal shown
        while True:
            finished = done.is_set()
            lines = events.read_text().splitlines()
            for line in lines[shown:]:
                say(line)
            shown = len(lines)
            if finished:
                return
            time.sleep(0.3)

    relayer = threading.Thread(target=relay, daemon=True)
    relayer.start()
    try:
        run = build_dag(json.loads(os.environ[SETTINGS])).test()
    finally:
        done.set()
        relayer.join()
    with create_session() as session:
        tries = [{"try": row.try_number, "state": str(row.state)} for row in session.query(
            TaskInstanceHistory).filter_by(dag_id=DAG_ID, run_id=run.run_id)]
        tries += [{"try": row.try_number, "state": str(row.state)} for row in session.query(
            TaskInstance).filter_by(dag_id=DAG_ID, run_id=run.run_id)]
    outcome = str(run.state)
    say(json.dumps({"outcome": outcome, "tries": sorted(tries, key=lambda t: t["try"]),
                    "seconds": round(time.monotonic() - started, 1)}))
    return 0 if outcome == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
