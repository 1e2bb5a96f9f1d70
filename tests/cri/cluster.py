"""The test cluster as the CRI tests see it: the nodes' kubelets, one timeline, the edge
host's namespace and the nodes' addresses (fixtures in tests/cri/conftest.py)."""

from __future__ import annotations

from kubelet import Kubelet, Timeline
from nodes import Cluster


class CriCluster:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.timeline = Timeline()
        self.kubelets = {n: Kubelet(node, self.timeline, dns=Cluster.EDGE) for n, node in cluster.nodes.items()}
        self.edge = cluster.edge  # the edge host's namespace
        self.addresses = {n: node.address for n, node in cluster.nodes.items()}

    def reset(self) -> None:
        """Between tests: every pod deleted (2 s grace), a new timeline."""
        for k in self.kubelets.values():
            k.cleanup()
            k.pods.clear()
        self.timeline = Timeline()
        for k in self.kubelets.values():
            k.timeline = self.timeline
