"""Planning on constructed cases whose answer is known by hand (no Ray, no torch)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError, SpecError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners import make_plan, profile_of
from m2flow.planners.profile import CHANNEL_HOP_S
from m2flow.planners.simulate import simulate_plan
from m2flow.schedule import Plan

NOTHING_BESIDE = frozenset()  # CPU-only plans: no port runs beside rendering (planners/render.py)


def workflow(
    env_s=0.002, policy_s=0.002, cpus=2, stages=1, mode="auto", env_replicas=1, num_envs=4, memory_gb=0.0, horizon=100
) -> dict:
    return {
        "name": "toy",
        "workers": {
            "env": {
                "kind": "simulator",
                "class": "tests.workers_for_tests.Counter",
                "replicas": env_replicas,
                "args": {"num_envs": num_envs},
                "profile": {"step": {"per_item_s": env_s / num_envs}},
            },
            "policy": {
                "kind": "inference",
                "class": "tests.workers_for_tests.PlusOne",
                "profile": {"act": {"per_item_s": policy_s / num_envs}},
                "resources": {"memory_gb": memory_gb},
            },
            "learner": {
                "kind": "training",
                "class": "tests.workers_for_tests.Collect",
                "profile": {"train": {"fixed_s": 0.05}},
            },
        },
        "flow": {
            "loop": {"horizon": horizon, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
            "then": ["env.trajectory -> learner.train"],
        },
        "placement": {"mode": mode, "pipeline_stages": stages},
        "cluster": {"cpus": cpus, "gpus": 0, "cpu_memory_gb": 4},
    }


def plan_of(raw: dict) -> Plan:
    spec = spec_from_dict(raw)
    return make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))


def test_colocated_replicas_share_a_process_and_pay_no_channel_hop():
    raw = workflow(cpus=1, mode="shared")
    raw["placement"]["colocate"] = True
    plan = plan_of(raw)
    assert plan.processes == [[("env", 0), ("policy", 0)]]  # the learner is not in the loop: a process of its own
    assert plan.predicted.phase_s["loop"] == pytest.approx(0.001 + 100 * 0.004, rel=1e-6)
    assert Plan.from_dict(plan.to_dict()).processes == plan.processes
    disjoint = workflow(cpus=2, mode="disaggregated")
    disjoint["workers"].pop("learner")
    disjoint["flow"].pop("then")
    disjoint["placement"]["colocate"] = True
    assert plan_of(disjoint).processes == []  # nothing shares a device: nothing to put together


def test_auto_colocates_where_the_hops_it_saves_are_worth_5_percent_and_says_which_it_chose():
    # each step: env and policy 0.1 ms each, two channel hops of 0.1 ms saved by sharing a process
    cheap = workflow(env_s=1e-4, policy_s=1e-4, cpus=1, mode="shared")
    plan = plan_of(cheap)
    assert plan.processes == [[("env", 0), ("policy", 0)]]
    assert any(n.startswith("colocate: auto co-hosts replicas on one device: predicted") for n in plan.notes)
    # 20 ms a step: the same hops are ~1%, not worth a crash taking its neighbours along
    costly = plan_of(workflow(env_s=0.01, policy_s=0.01, cpus=1, mode="shared"))
    assert costly.processes == []
    kept = "colocate: auto keeps a process per replica: co-hosting is predicted"
    assert any(n.startswith(kept) for n in costly.notes)
    cheap["placement"]["colocate"] = False  # asked for: no weighing, no note
    plan = plan_of(cheap)
    assert plan.processes == [] and not any(n.startswith("colocate:") for n in plan.notes)


def test_then_edges_stream_into_ports_that_take_parts_unless_a_swap_comes_first():
    plain = plan_of(workflow(mode="shared"))
    assert next(p for p in plain.phases if p.op == "then").streamed == []
    assert any("waits for the whole loop: learner takes no parts (no train_part)" in n for n in plain.notes)
    raw = workflow(mode="shared")
    raw["workers"]["learner"]["class"] = "tests.workers_for_tests.CollectParts"
    streaming = plan_of(raw)
    assert [str(e) for e in next(p for p in streaming.phases if p.op == "then").streamed] == [
        "env.trajectory -> learner.train"
    ]
    assert any("env.trajectory -> learner.train streams" in n for n in streaming.notes)
    raw["placement"]["offload"] = "always"  # learner and the loop workers swap on their shared device
    swapping = plan_of(raw)
    then = next(p for p in swapping.phases if p.op == "then")
    assert then.onload and then.streamed == []
    assert any("waits for the whole loop: a context switch comes first" in n for n in swapping.notes)


def test_shared_on_one_device_runs_the_loop_serially():
    plan = plan_of(workflow(cpus=1, mode="shared"))
    # entry handoff + 100 x (2 ms env + 2 ms policy + a channel hop into each), all on the one device
    assert plan.predicted.phase_s["loop"] == pytest.approx(0.001 + 100 * (0.004 + 2 * CHANNEL_HOP_S), rel=1e-6)
    assert plan.predicted.env_steps_per_iteration == 100 * 4
    assert {t.device.name for t in plan.tasks} == {"n0/cpu0"}


def test_a_message_between_processes_costs_its_hop_plus_its_items_so_a_slice_of_fewer_envs_costs_less():
    def apart(stages: int) -> MacroGraph:  # a process per replica: every loop message crosses processes
        raw = workflow(cpus=1, mode="shared", stages=stages, num_envs=8)
        raw["placement"]["colocate"] = False
        return build_graph(spec_from_dict(raw))

    graph = apart(1)
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    profile = replace(profile_of(graph, cluster), hop_s=0.0)
    without = simulate_plan(graph, plan, profile).prediction.phase_s["loop"]
    per_message = simulate_plan(graph, plan, replace(profile, hop_s=1e-4)).prediction.phase_s["loop"]
    profile.hop_item_s = 1e-5
    with_items = simulate_plan(graph, plan, profile).prediction.phase_s["loop"]
    # one core runs all: each of the 100 steps receives two messages (obs, actions), each of the 8 envs' items
    assert per_message - without == pytest.approx(100 * 2 * 1e-4, rel=1e-6)
    assert with_items - without == pytest.approx(100 * 2 * 8 * 1e-5, rel=1e-6)
    sliced = apart(2)
    halves = make_plan(sliced, cluster)
    assert halves.pipeline_stages == 2
    halves_without = simulate_plan(sliced, halves, replace(profile, hop_item_s=0.0)).prediction.phase_s["loop"]
    halves_with = simulate_plan(sliced, halves, profile).prediction.phase_s["loop"]
    # two slices of 4 envs: twice the messages, each of half the items: the items' part the same in all
    assert halves_with - halves_without == pytest.approx(100 * 2 * 8 * 1e-5, rel=1e-6)


def test_a_replica_receiving_from_several_replicas_gets_a_message_of_each_one_s_items():
    raw = workflow(cpus=2, mode="shared", env_replicas=2, num_envs=8)
    raw["placement"]["colocate"] = False
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    assert len(plan.placements["policy"].replica_devices) == 1 and not plan.processes

    def first_step_work(hop_item_s: float) -> dict[str, float]:
        """Per replica, the seconds of its first loop step's tasks, receiving included."""
        profile = replace(profile_of(graph, cluster), hop_s=0.0, hop_item_s=hop_item_s)
        work: dict[str, float] = {}
        for task in simulate_plan(graph, plan, profile).tasks():
            if task.phase == "loop" and task.step == 0:
                name = f"{task.worker}[{task.replica}]"
                work[name] = work.get(name, 0.0) + task.work_s
        return work

    without, with_items = first_step_work(0.0), first_step_work(1e-5)
    added = {name: with_items[name] - seconds for name, seconds in without.items()}
    # the policy receives each env replica's 8 observations, each env replica its own 8 actions
    assert added == pytest.approx({"policy[0]": 2 * 8 * 1e-5, "env[0]": 8 * 1e-5, "env[1]": 8 * 1e-5}, rel=1e-6)


def test_hybrid_pipelines_balanced_stages_towards_max_stage():
    plan = plan_of(workflow(cpus=2, mode="hybrid", stages=2))
    assert plan.placements["env"].devices != plan.placements["policy"].devices
    # two slices of 1 ms (+ a hop) each: per step max(env, policy), not the 4 ms of running both in turn
    assert plan.predicted.phase_s["loop"] == pytest.approx(100 * 2 * (0.001 + CHANNEL_HOP_S), rel=0.05)


def test_auto_prefers_pipelined_hybrid_when_env_and_policy_are_balanced():
    plan = plan_of(workflow(cpus=2, stages="auto"))
    assert plan.mode == "hybrid" and plan.pipeline_stages > 1
    ranked = [row.iteration_s for row in plan.candidates if row.feasible]
    assert ranked == sorted(ranked)
    shared = next(r for r in plan.candidates if r.mode == "shared")
    assert shared.iteration_s / plan.predicted.iteration_s > 1.6
    assert "auto chose hybrid" in plan.notes[0]


def test_auto_prefers_shared_when_one_device_only():
    plan = plan_of(workflow(cpus=1, stages="auto"))
    assert plan.mode == "shared"
    reasons = " ".join(r.reason for r in plan.candidates if not r.feasible)
    assert "need disjoint devices but only 1 exist" in reasons


def test_disaggregated_needs_a_device_per_worker():
    with pytest.raises(PlanError, match=r"3 workers \(env, policy, learner\) need disjoint devices but only 2 exist"):
        plan_of(workflow(cpus=2, mode="disaggregated"))
    plan = plan_of(workflow(cpus=3, mode="disaggregated"))
    assert len({d for p in plan.placements.values() for d in p.devices}) == 3
    assert not plan.sharing()


def test_more_replicas_than_devices_names_the_key():
    with pytest.raises(PlanError, match=r"workers\.env\.replicas: 4 replicas need 4 cpu devices, the cluster has 2"):
        plan_of(workflow(cpus=2, env_replicas=4))


def test_memory_beyond_the_device_is_infeasible_with_a_fix():
    with pytest.raises(PlanError) as info:
        plan_of(workflow(cpus=1, mode="shared", memory_gb=9))
    assert "workers.policy 9 GB" in str(info.value) and "has 4 GB" in str(info.value)


def test_too_many_stages_for_the_envs_names_the_key():
    with pytest.raises(PlanError, match="placement.pipeline_stages: 8 slices"):
        plan_of(workflow(stages=8, num_envs=4))


def test_plan_round_trips_through_dict():
    plan = plan_of(workflow())
    again = Plan.from_dict(plan.to_dict())
    assert again.to_dict() == plan.to_dict()


def test_device_lists_parse_as_rlinf_users_write_them():
    from m2flow.planners.manual import parse_devices

    assert parse_devices("0-3", 8, "k") == [0, 1, 2, 3]
    assert parse_devices("0-1,4", 8, "k") == [0, 1, 4]
    assert parse_devices("all", 3, "k") == [0, 1, 2]
    assert parse_devices(5, 8, "k") == [5]
    with pytest.raises(PlanError, match=r"placement.devices.env: devices \[8\] do not exist; the cluster has 8"):
        parse_devices("4-8", 8, "placement.devices.env")
    with pytest.raises(PlanError, match="not a device list"):
        parse_devices("first", 8, "k")


def test_a_manual_layout_is_checked_completed_and_compared_with_auto():
    from m2flow.planners import compare_with_auto

    raw = workflow(cpus=4, stages="auto")
    raw["placement"]["devices"] = {"env": "0-1", "policy": "2-3"}  # the learner is left to span all
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    plan = compare_with_auto(graph, cluster, make_plan(graph, cluster))
    assert plan.mode == "manual (hybrid)"
    cpus = Cluster.from_spec(spec.cluster).of_kind("cpu")
    assert plan.placements["learner"].devices == cpus
    assert plan.placements["env"].devices == cpus[:2] and plan.placements["policy"].devices == cpus[2:]
    assert plan.pipeline_stages > 1
    assert "your layout (manual (hybrid)" in plan.notes[-1] and "auto's best" in plan.notes[-1]


def test_a_manual_layout_naming_an_unknown_worker_is_refused():
    raw = workflow()
    raw["placement"]["devices"] = {"learnr": "all"}
    with pytest.raises(SpecError, match="placement.devices.learnr: no worker named 'learnr'; did you mean 'learner'"):
        plan_of(raw)


def test_a_training_worker_too_large_to_share_goes_disaggregated():
    raw = workflow(stages="auto")
    raw["cluster"] = {"gpus": 3, "cpus": 3, "gpu_memory_gb": 80}
    raw["workers"]["policy"]["resources"] = {"memory_gb": 30}
    raw["workers"]["learner"]["resources"] = {"memory_gb": 70}  # with the policy: 100 GB on an 80 GB GPU
    plan = plan_of(raw)
    assert plan.mode == "disaggregated"
    assert not set(plan.placements["policy"].devices) & set(plan.placements["learner"].devices)
    shared = next(r for r in plan.candidates if r.mode == "shared")
    # sharing is only possible by swapping 100 GB through host memory every iteration: far slower
    assert shared.iteration_s > 2 * plan.predicted.iteration_s


def test_offload_never_makes_the_oversubscribed_layout_infeasible_and_says_how_to_fix_it():
    raw = workflow(mode="shared")
    raw["cluster"] = {"gpus": 1, "cpus": 1, "gpu_memory_gb": 80}
    raw["workers"]["policy"]["resources"] = {"memory_gb": 30}
    raw["workers"]["learner"]["resources"] = {"memory_gb": 70}
    raw["placement"]["offload"] = "never"
    with pytest.raises(PlanError, match="would hold 100 GB .* placement.offload=auto"):
        plan_of(raw)
    raw["placement"]["offload"] = "auto"
    plan = plan_of(raw)
    assert any(p.offload or p.onload for p in plan.phases)


def test_auto_can_choose_how_many_simulator_processes_share_the_envs():
    raw = workflow(cpus=4, stages=1, num_envs=8)  # one process of 8 envs declared
    raw["workers"]["policy"]["profile"] = {"act": {"fixed_s": 1e-4}}  # a cheap policy: the simulator dominates
    raw["placement"]["search_processes"] = True
    plan = plan_of(raw)
    procs = int(plan.spec_overrides[0].split("=")[1])
    assert plan.spec_overrides == [f"workers.env.replicas={procs}", f"workers.env.args.num_envs={8 // procs}"]
    assert procs == 4  # 4 processes on 4 cores step their 2 envs each in parallel
    assert len(plan.placements["env"].replica_devices) == 4
    assert plan.predicted.env_steps_per_iteration == 100 * 8  # the same envs, split differently
    assert plan.notes[0].startswith("allocation: env 4 x 2")
    layouts = {row.layout for row in plan.candidates}
    assert {"env 1 x 8", "env 2 x 4", "env 4 x 2"} <= layouts


def test_disjoint_modes_try_several_device_splits_and_keep_the_fastest():
    from m2flow.planners.disaggregated import DisaggregatedPlanner, disjoint, distinct, split_weights
    from m2flow.planners.profile import Profile
    from m2flow.planners.simulate import simulation
    from m2flow.program import build_phases

    # devices are scarce (4 for 9 replicas) and the policy does most of the work: splits disagree
    raw = workflow(cpus=4, mode="disaggregated", env_replicas=4, env_s=0.001, policy_s=0.01)
    raw["workers"]["policy"]["replicas"] = 4
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    profile = Profile.from_graph(graph)
    options = distinct(
        {n: disjoint(graph, cluster, list(graph.workers), w) for n, w in split_weights(graph, profile).items()}
    )
    assert len(options) >= 2
    times = {
        n: simulation(
            graph, p, 1, profile, build_phases(graph), [], beside_rendering=NOTHING_BESIDE
        ).prediction.iteration_s
        for n, p in options.items()
    }
    plan = DisaggregatedPlanner().plan(graph, cluster, profile)
    assert plan.predicted.iteration_s == pytest.approx(min(times.values()))
    assert f"best of {len(options)} splits" in plan.notes[0]


def test_allocation_gives_a_training_group_the_ranks_its_work_pays_for():
    """Training dominates (0.4 ms per env step) and the loop has 4 shards on 4 cores: four data-parallel
    ranks each take a quarter of the update — the best the cluster allows; `{max: 2}` caps it at two."""
    raw = workflow(cpus=4, mode="shared", env_replicas=4, num_envs=2)
    raw["workers"]["learner"]["replicas"] = "auto"
    raw["workers"]["learner"]["profile"] = {"train": {"per_item_s": 4e-4}}
    plan = plan_of(raw)
    assert "workers.learner.replicas=4" in plan.spec_overrides
    assert plan.notes[0].startswith("allocation: learner 4")
    assert not any(n.startswith("left idle") for n in plan.notes)
    raw["workers"]["learner"]["replicas"] = {"max": 2}
    assert "workers.learner.replicas=2" in plan_of(raw).spec_overrides


def test_allocation_leaves_devices_idle_only_with_a_reason():
    raw = workflow(cpus=4, mode="shared")  # nothing scales: one replica each on 4 cores
    plan = plan_of(raw)
    assert plan.spec_overrides == []
    raw["workers"]["policy"]["replicas"] = "auto"  # one shard in the loop: a second policy replica would idle
    plan = plan_of(raw)
    idle = [n for n in plan.notes if n.startswith("left idle")]
    assert idle and "more replicas of policy were predicted no faster" in idle[0]


def test_the_loop_table_names_the_replica_that_bounds_the_loop_and_the_one_that_waits():
    from rich.console import Console

    from m2flow.schedule import ReplicaId
    from m2flow.viz.tables import loop_table

    plan = plan_of(workflow(cpus=2, mode="hybrid", stages=2))
    busy = {ReplicaId("env", 0): {"step": 7.0, "obs": 0.5}, ReplicaId("policy", 0): {"act": 2.0}}
    table, verdict = loop_table(plan, busy, loop_s=10.0)
    env_device = plan.device_of(ReplicaId("env", 0)).name
    assert verdict == f"loop: bound by env[0] on {env_device} (75% busy); policy[0] waits most (80% of the loop)"
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "obs 5%, step 70%" in text and "act 20%" in text and "25%" in text


@pytest.mark.parametrize(
    ("cpus", "env_replicas", "policies", "expected"),
    [
        (8, 8, 2, [0, 4]),  # each with the first env of its block, not on cpu0 and cpu1
        (8, 4, 3, [0, 2, 3]),  # blocks [0, 1], [2], [3]
        (2, 2, 2, [0, 1]),  # as many as the envs: round-robin, as before
    ],
)
def test_shared_puts_each_policy_replica_on_a_device_of_the_envs_it_serves(cpus, env_replicas, policies, expected):
    raw = workflow(cpus=cpus, mode="shared", env_replicas=env_replicas)
    raw["workers"]["policy"]["replicas"] = policies
    plan = plan_of(raw)
    assert [d.index for d in plan.placements["policy"].replica_devices] == expected


def test_shared_async_places_training_on_the_least_loaded_device_after_the_policy_sits_with_its_envs():
    raw = workflow(cpus=4, mode="shared", env_replicas=4)
    raw["workers"]["policy"]["replicas"] = 2
    raw["flow"]["async"] = {"max_staleness": 1}
    plan = plan_of(raw)
    assert [d.index for d in plan.placements["policy"].replica_devices] == [0, 2]
    assert [d.index for d in plan.placements["learner"].replica_devices] == [1]  # one env there, no policy
