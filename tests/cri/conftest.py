"""The CRI test cluster: two nodes and an edge host (tests/cri/nodes.py) with a containerd
each, the images of the private dockerd imported, and one kubelet per node; started once
per session, stopped at its end whatever happened."""

from __future__ import annotations

from typing import Iterator

import pytest

from enginelib import HAPROXY_IMAGE, SPOA_IMAGE, TURN_IMAGE, Engine
from cluster import CriCluster
from nodes import Cluster


@pytest.fixture(scope="session")
def cri_cluster(engine: Engine) -> Iterator[Cluster]:
    cluster = Cluster()
    try:
        cluster.start(engine, [SPOA_IMAGE, TURN_IMAGE, HAPROXY_IMAGE])
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture()
def cluster(cri_cluster: Cluster) -> Iterator[CriCluster]:
    tc = CriCluster(cri_cluster)
    try:
        yield tc
    finally:
        tc.reset()
