"""Collectives on the link each one uses: MT-3000's one inter-cluster link, or a GPU cluster's
links under Megatron's rank placement.

MT-3000 (:class:`LinkCollectives`): every collective is a ring over the inter-cluster link
(``TrainingPlatform.link_bandwidth``, ``link_latency_s`` per message), whatever its group:
all-reduce 2 (n - 1) / n * S / bw + 2 (n - 1) latency, reduce-scatter and all-gather half of that,
point to point S / bw + latency (``ratrain.cost.terms`` states why).

GPU clusters (:class:`GpuCollectives`), as follows.

Placement (Megatron's order): global rank = pp_rank * T * D + dp_rank * T + tp_rank, and ranks
fill nodes in order (``gpus_per_node`` per node). So a tensor-parallel group is T adjacent ranks,
a data-parallel group D ranks T apart, and a pipeline neighbour T * D ranks away; each collective
runs inside a node when all of its ranks do, else across the nodes' NICs.

Cost of one collective over n ranks moving S bytes per rank (NCCL's algorithms, the formula
nccl-tests reports its bus bandwidth with):

- ring all-reduce: launch + 2 (n - 1) step latency + 2 (n - 1) / n * S / bus bandwidth;
- ring reduce-scatter or all-gather: launch + (n - 1) step latency + (n - 1) / n * S / bus bandwidth;
- tree all-reduce (``algorithm = "tree"``; ``"auto"`` takes the cheaper): launch
  + 2 ceil(log2 n) step latency + 2 S / bus bandwidth (a pipelined double binary tree moves each
  byte up and down once per rank);
- point to point: launch + latency of the link + S / link bandwidth.

Bus bandwidth of a group: inside a node ``intra_bandwidth * intra_bus_efficiency``, halved where
the node has no peer-to-peer path (every byte is written to host memory and read back over the
same PCIe links); across nodes the smaller of that and the node's NIC bandwidth that falls to the
group: ``nics_per_node * nic_bandwidth * inter_bus_efficiency * g / gpus_per_node``, where g is
the group's ranks per node (the node's other GPUs run their own groups' copy of the same
collective at the same time and share the NICs). ``launch_s``, ``step_latency_s`` and
``intra_bus_efficiency`` are fitted on measured all-reduce times (:func:`fit_allreduce`).

Groups inside the data-parallel ranks (expert parallelism EP and context parallelism CP are carved
out of them, ``ratrain.spec.parallel``): the ``*_in_data_group`` methods run over ``ranks`` ranks of
the data group ``stride`` apart (EP and CP groups: adjacent, stride 1; the ranks holding the same
experts: stride EP), on that group's link:
- all-to-all (pairwise exchange; each rank sends S / n to every other over its one port):
  (n - 1) / n * S / bw + (n - 1) latency (GPU: plus a launch, step latency for latency);
- ring exchange (context parallelism's K/V ring): n - 1 steps, each one point-to-point message of S
  bytes to the ring neighbour;
- reduce-scatter and all-reduce as above, over that group.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ratrain.errors import ConfigError
from ratrain.spec.gpu import GpuPlatform
from ratrain.spec.platform import TrainingPlatform

GROUPS = ("tp", "dp", "pp", "embedding")


@dataclass(frozen=True)
class Placement:
    """Megatron's rank grid: T tensor ranks adjacent, then D data ranks, then P pipeline stages."""
    tp: int
    dp: int
    pp: int

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return pp_rank * self.tp * self.dp + dp_rank * self.tp + tp_rank

    def group(self, kind: str) -> list[int]:
        """The ranks of the first group of ``kind`` (every group of a kind has the same shape)."""
        if kind == "tp":
            return [self.rank(t, 0, 0) for t in range(self.tp)]
        if kind == "dp":
            return [self.rank(0, d, 0) for d in range(self.dp)]
        if kind == "pp":
            return [self.rank(0, 0, p) for p in range(min(self.pp, 2))]
        if kind == "embedding":       # first and last stage hold the tied embedding
            return sorted({self.rank(0, 0, 0), self.rank(0, 0, self.pp - 1)})
        raise ConfigError(f"collective group must be one of {', '.join(GROUPS)}, got {kind!r}")


def ring_allreduce_ms(nbytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    """Ring all-reduce: 2(n-1) steps each moving bytes/n per rank, one latency per step."""
    if ranks <= 1:
        return 0.0
    return 1e3 * (2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * latency_s)


def ring_reduce_scatter_ms(nbytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    """Ring reduce-scatter (and, by symmetry, all-gather): (n-1) steps of bytes/n."""
    if ranks <= 1:
        return 0.0
    return 1e3 * ((ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * latency_s)


def alltoall_ms(nbytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    """All-to-all of ``nbytes`` per rank over ``ranks`` ranks: (n-1)/n of it leaves, one latency per peer."""
    if ranks <= 1:
        return 0.0
    return 1e3 * ((ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * latency_s)


def _group_size(placement: Placement, kind: str) -> int:
    return {"tp": placement.tp, "dp": placement.dp, "pp": min(placement.pp, 2),
            "embedding": 2 if placement.pp > 1 else 1}[kind]


class LinkCollectives:
    """MT-3000: every collective on the one inter-cluster link (times in milliseconds)."""

    def __init__(self, platform: TrainingPlatform, placement: Placement):
        self.platform = platform
        self.placement = placement

    def allreduce_ms(self, nbytes: float, kind: str) -> float:
        p = self.platform
        return ring_allreduce_ms(nbytes, _group_size(self.placement, kind), p.link_bandwidth, p.link_latency_s)

    def reduce_scatter_ms(self, nbytes: float, kind: str) -> float:
        p = self.platform
        return ring_reduce_scatter_ms(nbytes, _group_size(self.placement, kind), p.link_bandwidth, p.link_latency_s)

    all_gather_ms = reduce_scatter_ms

    def p2p_ms(self, nbytes: float) -> float:
        return 1e3 * (nbytes / self.platform.link_bandwidth + self.platform.link_latency_s)

    def shares_link(self, a: str, b: str) -> bool:
        """Whether two groups' collectives compete for one link: on MT-3000 always."""
        return True

    def alltoall_in_data_group(self, nbytes: float, ranks: int, stride: int = 1) -> float:
        p = self.platform
        return alltoall_ms(nbytes, ranks, p.link_bandwidth, p.link_latency_s)

    def ring_exchange_in_data_group(self, nbytes: float, ranks: int, stride: int = 1) -> float:
        return (ranks - 1) * self.p2p_ms(nbytes) if ranks > 1 else 0.0

    def reduce_in_data_group(self, nbytes: float, ranks: int, stride: int = 1, *, scatter: bool) -> float:
        p = self.platform
        fn = ring_reduce_scatter_ms if scatter else ring_allreduce_ms
        return fn(nbytes, ranks, p.link_bandwidth, p.link_latency_s)


class GpuCollectives:
    """Collective and point-to-point times (milliseconds) of one layout on a GPU platform."""

    def __init__(self, platform: GpuPlatform, placement: Placement):
        self.platform = platform
        self.placement = placement
        self._bus = {kind: self._bus_bandwidth(placement.group(kind)) for kind in GROUPS}

    # -- where a group's bytes flow
    def _nodes(self, ranks: list[int]) -> dict[int, int]:
        per = self.platform.node.gpus_per_node
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r // per] = counts.get(r // per, 0) + 1
        return counts

    def _intra_bus(self) -> float:
        node, coll = self.platform.node, self.platform.collectives
        rate = node.intra_bandwidth * coll.intra_bus_efficiency
        return rate if node.peer_to_peer else rate / 2

    def _bus_bandwidth(self, ranks: list[int]) -> float:
        nodes = self._nodes(ranks)
        intra = self._intra_bus()
        if len(nodes) <= 1:
            return intra
        net, coll = self.platform.network, self.platform.collectives
        per_node = max(nodes.values())
        share = net.nics_per_node * net.nic_bandwidth * coll.inter_bus_efficiency * per_node \
            / self.platform.node.gpus_per_node
        return min(intra, share)

    def crosses_nodes(self, kind: str) -> bool:
        return len(self._nodes(self.placement.group(kind))) > 1

    def _size(self, kind: str) -> int:
        return _group_size(self.placement, kind)

    def shares_link(self, a: str, b: str) -> bool:
        """Two groups compete for a link when both stay inside the node (the NVLink/PCIe fabric) or
        both cross nodes (the NICs)."""
        return self.crosses_nodes(a) == self.crosses_nodes(b)

    # -- the collectives
    def allreduce_ms(self, nbytes: float, kind: str) -> float:
        n = self._size(kind)
        if n <= 1:
            return 0.0
        coll, bus = self.platform.collectives, self._bus[kind]
        ring = coll.launch_s + 2 * (n - 1) * coll.step_latency_s + 2 * (n - 1) / n * nbytes / bus
        tree = coll.launch_s + 2 * math.ceil(math.log2(n)) * coll.step_latency_s + 2 * nbytes / bus
        choice = {"ring": ring, "tree": tree}.get(coll.algorithm, min(ring, tree))
        return 1e3 * choice

    def reduce_scatter_ms(self, nbytes: float, kind: str) -> float:
        n = self._size(kind)
        if n <= 1:
            return 0.0
        coll, bus = self.platform.collectives, self._bus[kind]
        return 1e3 * (coll.launch_s + (n - 1) * coll.step_latency_s + (n - 1) / n * nbytes / bus)

    all_gather_ms = reduce_scatter_ms

    def _data_subgroup(self, ranks: int, stride: int) -> float:
        if ranks * stride > self.placement.dp:
            raise ConfigError(f"a group of {ranks} ranks {stride} apart exceeds the {self.placement.dp} data ranks")
        return self._bus_bandwidth([self.placement.rank(0, d * stride, 0) for d in range(ranks)])

    def alltoall_in_data_group(self, nbytes: float, ranks: int, stride: int = 1) -> float:
        if ranks <= 1:
            return 0.0
        coll, bus = self.platform.collectives, self._data_subgroup(ranks, stride)
        return 1e3 * (coll.launch_s + (ranks - 1) * coll.step_latency_s + (ranks - 1) / ranks * nbytes / bus)

    def ring_exchange_in_data_group(self, nbytes: float, ranks: int, stride: int = 1) -> float:
        if ranks <= 1:
            return 0.0
        coll, bus = self.platform.collectives, self._data_subgroup(ranks, stride)
        return 1e3 * (ranks - 1) * (coll.launch_s + coll.step_latency_s + nbytes / bus)

    def reduce_in_data_group(self, nbytes: float, ranks: int, stride: int = 1, *, scatter: bool) -> float:
        if ranks <= 1:
            return 0.0
        coll, bus = self.platform.collectives, self._data_subgroup(ranks, stride)
        steps = (ranks - 1) * (1 if scatter else 2)
        return 1e3 * (coll.launch_s + steps * coll.step_latency_s + steps / ranks * nbytes / bus)

    def p2p_ms(self, nbytes: float) -> float:
        """One pipeline-stage boundary message (to the neighbour T * D ranks away)."""
        coll = self.platform.collectives
        if self.crosses_nodes("pp"):
            net = self.platform.network
            rate, latency = net.nic_bandwidth * coll.inter_bus_efficiency, net.latency_s
        else:
            rate, latency = self._intra_bus(), self.platform.node.intra_latency_s
        return 1e3 * (coll.launch_s + latency + nbytes / rate)


# ---------------------------------------------------------------- fit on measured all-reduces

@dataclass(frozen=True)
class AllreduceFit:
    """Ring all-reduce constants fitted on measured times inside one node, and what they leave."""
    launch_s: float
    step_latency_s: float
    bus_bandwidth: float             # bytes/s
    intra_bus_efficiency: float      # bus_bandwidth / the platform's intra_bandwidth
    rows: int
    mean_abs_error: float            # relative, over the rows
    max_abs_error: float
    per_gpus: dict                   # n -> (mean, max) relative error

    def to_json(self) -> dict:
        return {"launch_s": self.launch_s, "step_latency_s": self.step_latency_s, "bus_bandwidth": self.bus_bandwidth,
                "intra_bus_efficiency": self.intra_bus_efficiency, "rows": self.rows,
                "mean_abs_error": self.mean_abs_error, "max_abs_error": self.max_abs_error,
                "per_gpus": {str(k): {"mean_abs_error": v[0], "max_abs_error": v[1]}
                             for k, v in sorted(self.per_gpus.items())}}


def fit_allreduce(samples: list[tuple[int, float, float]], intra_bandwidth: float) -> AllreduceFit:
    """Least squares, in relative error, of t = a + 2 (n - 1) c + 2 (n - 1) / n * S / B over
    (n GPUs, S bytes, t seconds) samples: three unknowns a (launch), c (step latency) and 1/B,
    linear in all three, so one weighted linear solve (no search, nothing random)."""
    if len(samples) < 3:
        raise ConfigError(f"all-reduce fit needs at least 3 measurements, got {len(samples)}")
    n = np.array([s[0] for s in samples], dtype=float)
    size = np.array([s[1] for s in samples], dtype=float)
    t = np.array([s[2] for s in samples], dtype=float)
    design = np.stack([np.ones_like(n), 2 * (n - 1), 2 * (n - 1) / n * size], axis=1) / t[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    a, c, inv_b = (float(x) for x in coef)
    if inv_b <= 0:
        raise ConfigError("all-reduce fit: the measurements give no positive bus bandwidth")
    a, c = max(a, 0.0), max(c, 0.0)
    pred = a + 2 * (n - 1) * c + 2 * (n - 1) / n * size * inv_b
    err = np.abs(pred - t) / t
    per = {int(k): (float(err[n == k].mean()), float(err[n == k].max())) for k in sorted(set(n.tolist()))}
    return AllreduceFit(a, c, 1 / inv_b, (1 / inv_b) / intra_bandwidth, len(t), float(err.mean()),
                        float(err.max()), per)


def collectives_for(platform: TrainingPlatform | GpuPlatform, tp: int, dp: int, pp: int
                    ) -> LinkCollectives | GpuCollectives:
    """The collectives of a T x D x P layout on either kind of platform."""
    placement = Placement(tp, dp, pp)
    if isinstance(platform, GpuPlatform):
        return GpuCollectives(platform, placement)
    return LinkCollectives(platform, placement)


__all__ = ["GROUPS", "AllreduceFit", "alltoall_ms", "GpuCollectives", "LinkCollectives", "Placement", "collectives_for",
           "fit_allreduce", "ring_allreduce_ms", "ring_reduce_scatter_ms"]
