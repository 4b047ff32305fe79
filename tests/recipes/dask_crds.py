"""Install the Dask operator's CRDs from what dask-kubernetes ships (its Helm chart's `crds/`,
the same files `helm install dask-kubernetes-operator` applies), as a cluster admin would once
per cluster. Run with the recipes' clients python; KUBECONFIG is an admin's.

    python dask_crds.py            # creates or replaces the four CRDs, waits until established

Create-or-replace rather than `kubectl apply`: the DaskJob CRD is ~470 KB, past the 256 KB
limit of the last-applied annotation a client-side apply writes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dask_kubernetes
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

CRDS = (Path(dask_kubernetes.__file__).parent / "operator" / "deployment" / "helm"
        / "dask-kubernetes-operator" / "crds")


def main() -> int:
    files = sorted(CRDS.glob("*.yaml"))
    if len(files) != 4:
        print(f"expected the 4 Dask CRDs in {CRDS}, found {[f.name for f in files]}",
              file=sys.stderr)
        return 1
    config.load_kube_config()
    api = client.ApiextensionsV1Api()
    names = []
    for path in files:
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            api.create_custom_resource_definition(crd)
        except ApiException as error:
            if error.status != 409:
                raise
            for _ in range(5):  # another installer may replace it at the same time
                crd["metadata"]["resourceVersion"] = (
                    api.read_custom_resource_definition(name).metadata.resource_version)
                try:
                    api.replace_custom_resource_definition(name, crd)
                    break
                except ApiException as conflict:
                    if conflict.status != 409:
                        raise
    deadline = time.monotonic() + 60
    for name in names:
        while not any(c.type == "Established" and c.status == "True"
                      for c in api.read_custom_resource_definition(name).status.conditions
                      or []):
            if time.monotonic() > deadline:
                print(f"CRD {name} not established within 60 s", file=sys.stderr)
                return 1
            time.sleep(0.2)
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
