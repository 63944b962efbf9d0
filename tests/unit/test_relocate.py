"""Where a replica whose node is lost starts again in place: the least occupied core the run holds on a node
that still answers, all the failed replicas moved or none; the driver's node and a one-node cluster never
asked, a node found lost not asked again. The nodes are asked through the `probe` given (here a record of
the questions and a fixed answer; the Ray probe itself runs in tests/integration/test_hosts.py)."""

from collections import Counter

import pytest

from m2flow.cluster import Cluster, DeviceId
from m2flow.errors import WorkerError
from m2flow.runtime.relocate import Move, Relocator, stand_in
from m2flow.schedule import ReplicaId

CORES = [DeviceId(0, "cpu", 0), DeviceId(0, "cpu", 1), DeviceId(1, "cpu", 2), DeviceId(1, "cpu", 3)]
GPU = DeviceId(1, "gpu", 0)
TWO_NODES = Cluster(dict.fromkeys([GPU, *CORES], 8.0), 2, ("node-a", "node-b"))
ENV0, ENV1, ROLLOUT = ReplicaId("env", 0), ReplicaId("env", 1), ReplicaId("rollout", 0)


class Answers:
    """A probe that records what it was asked and takes `gone` for lost."""

    def __init__(self, gone: set[str]):
        self.gone, self.asked = gone, []

    def __call__(self, node_ids: tuple[str, ...], timeout_s: float) -> set[str]:
        self.asked.append(node_ids)
        return set(node_ids) & self.gone


def relocator(probe: Answers, cluster: Cluster = TWO_NODES, here: str | None = "node-a") -> Relocator:
    return Relocator(cluster, [GPU, *CORES], 10.0, probe, here, address=lambda node: f"addr-of-{node}")


def test_a_replica_off_a_lost_node_borrows_the_least_occupied_core_of_a_node_left():
    load = Counter({CORES[0]: 2, CORES[1]: 1, CORES[2]: 1, CORES[3]: 0})
    assert stand_in(CORES, lost={1}, load=load) == CORES[1]


def test_on_a_tie_the_first_core_is_borrowed_and_lost_nodes_are_never_chosen():
    assert stand_in(CORES, lost={1}, load=Counter()) == CORES[0]
    assert stand_in(CORES, lost={0}, load=Counter({CORES[2]: 1})) == CORES[3]


def test_a_failed_replica_on_a_lost_node_moves_to_the_freer_core_left_and_the_move_is_recorded():
    probe = Answers(gone={"node-b"})
    moves = relocator(probe)
    running = {ENV0: CORES[1], ENV1: CORES[2], ROLLOUT: CORES[0], ReplicaId("actor", 0): CORES[0]}
    moves.move({ENV1: CORES[2]}, running)

    assert moves.moves == {ENV1: Move(CORES[1], "addr-of-node-b")}
    assert moves.device_of(ENV1, CORES[2]) == CORES[1] and moves.device_of(ENV0, CORES[1]) == CORES[1]
    assert moves.lost_ids() == {"node-b"}
    assert probe.asked == [("node-b",)]  # the driver's node is never asked


def test_a_replica_on_a_node_that_answers_stays_and_a_node_found_lost_is_not_asked_again():
    probe = Answers(gone=set())
    moves = relocator(probe)
    moves.move({ENV1: CORES[2]}, {ENV1: CORES[2]})
    assert moves.moves == {} and probe.asked == [("node-b",)]

    probe.gone = {"node-b"}
    moves.move({ENV1: CORES[2]}, {ENV1: CORES[2]})
    assert set(moves.moves) == {ENV1}
    moves.move({ENV0: CORES[3]}, {ENV0: CORES[3], ENV1: CORES[0]})
    assert set(moves.moves) == {ENV0, ENV1} and probe.asked == [("node-b",), ("node-b",)]


def test_one_node_and_the_drivers_own_node_are_never_asked():
    probe = Answers(gone={"node-a", "node-b"})
    one_node = Cluster(dict.fromkeys(CORES[:2], 8.0), 1, ("node-a",))
    relocator(probe, one_node).move({ENV0: CORES[0]}, {ENV0: CORES[0]})
    relocator(probe).move({ENV0: CORES[0]}, {ENV0: CORES[0]})
    assert probe.asked == []


@pytest.mark.parametrize(
    ("failed", "unmovable", "says"),
    [
        ({ROLLOUT: GPU}, None, "a GPU-placed replica moves only by a re-plan"),
        ({ReplicaId("actor", 1): CORES[2]}, "a training worker moves only by a re-plan", "a training worker"),
    ],
)
def test_a_replica_that_cannot_move_fails_the_move_naming_itself_and_the_node(failed, unmovable, says):
    moves = relocator(Answers(gone={"node-b"}))
    with pytest.raises(WorkerError) as raised:
        moves.move(failed, dict(failed), lambda *_: unmovable)
    assert f"{next(iter(failed))} ran on the node at addr-of-node-b, which no longer answers, and {says}" in str(
        raised.value
    )
    assert "re-plans on the nodes left" in str(raised.value) and moves.moves == {}


def test_a_lost_node_that_still_hosts_a_replica_not_failed_fails_the_move_and_moves_none():
    moves = relocator(Answers(gone={"node-b"}))
    running = {ENV0: CORES[3], ENV1: CORES[2], ROLLOUT: CORES[0]}
    with pytest.raises(WorkerError, match=r"node\(s\) at addr-of-node-b no longer answer, with env\[0\] still"):
        moves.move({ENV1: CORES[2]}, running)
    assert moves.moves == {}


def test_with_every_other_node_lost_no_core_is_left_to_borrow():
    cores_of_b = Cluster(dict.fromkeys(CORES, 8.0), 2, ("node-a", "node-b"))
    moves = Relocator(cores_of_b, CORES[2:], 10.0, Answers(gone={"node-b"}), "node-a", address=str)
    with pytest.raises(WorkerError, match="this run holds no CPU core on another node"):
        moves.move({ENV1: CORES[2]}, {ENV1: CORES[2]})
