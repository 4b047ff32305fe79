"""The devstack's KRaft cluster ids: what `kafka-storage format -t` accepts."""

from __future__ import annotations

import base64

from devstack.kafka import new_cluster_id


def test_cluster_ids_never_start_with_a_dash() -> None:
    # One url-safe base64 id in 64 starts with "-", and the storage tool then reads it as a flag
    # ("argument --cluster-id/-t: expected one argument"); 2,000 draws meet that case with
    # probability 1 - (63/64)**2000, about 1 - 2e-14.
    ids = [new_cluster_id() for _ in range(2000)]
    assert not [cluster_id for cluster_id in ids if cluster_id.startswith("-")]
    assert len(set(ids)) == len(ids)
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
