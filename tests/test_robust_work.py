"""Work guards: sizes whose work would run for hours or fill the host's memory are refused up
front, naming the bound; the closed forms give what the step-by-step forms gave."""
import time

import pytest

from mtemu.assembler import MAX_PROGRAM_BUNDLES, AssemblyError, ProgramBuilder
from mtemu.platform import DEFAULT
from ratrain.cost.tasks import LayerCosts, PipelineCosts
from ratrain.errors import ConfigError
from ratrain.sim.simulator import MAX_SIM_TASKS, simulate
from ratrain.spec.parallel import partition_layers


def test_partition_with_huge_extras_is_immediate():
    start = time.monotonic()
    counts = [len(r) for r in partition_layers(32, 4, 1e12, 1e12)]
    assert counts == [1, 15, 15, 1] and time.monotonic() - start < 1.0


@pytest.mark.parametrize("layers, pp, first, last, counts", [
    (32, 4, 0.0, 0.0, [8, 8, 8, 8]), (10, 4, 0.0, 0.0, [2, 2, 3, 3]), (32, 4, 2.5, 3.2, [7, 9, 10, 6]),
    (8, 2, 100.0, 0.0, [1, 7])])
def test_partition_matches_the_balanced_rule(layers, pp, first, last, counts):
    assert [len(r) for r in partition_layers(layers, pp, first, last)] == counts


def test_simulate_refuses_work_beyond_its_bound():
    layer = LayerCosts(**{name: 1.0 for name in ("forward_ms", "backward_ms")})
    costs = PipelineCosts(stages=[[layer] * 200_000, [layer] * 200_000], transfer_ms=0.1, microbatches=8)
    with pytest.raises(ConfigError, match=f"above the simulator's bound of {MAX_SIM_TASKS:,}"):
        simulate(costs)


def test_a_latency_padded_program_is_refused_before_it_grows():
    plat = DEFAULT.with_overrides(latencies={"vmac": 10 ** 6})
    b = ProgramBuilder(plat)
    with pytest.raises(AssemblyError, match=r"latencies\.vmac = 1000000 cycles"):
        b.nops(MAX_PROGRAM_BUNDLES + 1)
    assert len(b._bundles) == 0
