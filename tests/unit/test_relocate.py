"""Where a replica whose node is gone borrows a core: the least occupied one the run holds on a node that
still answers; none for a GPU-placed replica or where no such core is left."""

from collections import Counter

from m2flow.cluster import DeviceId
from m2flow.runtime.relocate import stand_in

CORES = [DeviceId(0, "cpu", 0), DeviceId(0, "cpu", 1), DeviceId(1, "cpu", 2), DeviceId(1, "cpu", 3)]
GPU = DeviceId(1, "gpu", 0)


def test_a_replica_off_a_lost_node_borrows_the_least_occupied_core_of_a_node_left():
    load = Counter({CORES[0]: 2, CORES[1]: 1, CORES[2]: 1, CORES[3]: 0})
    assert stand_in(CORES[2], CORES, lost={1}, load=load) == CORES[1]


def test_on_a_tie_the_first_core_is_borrowed_and_lost_nodes_are_never_chosen():
    assert stand_in(CORES[3], CORES, lost={1}, load=Counter()) == CORES[0]
    assert stand_in(CORES[0], CORES, lost={0}, load=Counter({CORES[2]: 1})) == CORES[3]


def test_no_core_is_borrowed_for_a_gpu_replica_or_where_every_node_is_lost():
    assert stand_in(GPU, [*CORES, GPU], lost={1}, load=Counter()) is None
    assert stand_in(CORES[2], CORES, lost={0, 1}, load=Counter()) is None
