"""The interaction loop on the real Ray cluster: shards, slices, channels, counts, failures."""

from __future__ import annotations

import json
import re
import time

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import WaitTimeout, WorkerError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def counter_workflow(
    tmp_path, policy="PlusOne", env_replicas=2, num_envs=3, horizon=5, mode="shared", stages=1, offload="never", **run
) -> mf.WorkflowSpec:
    return spec_from_dict(
        {
            "name": "counter",
            "workers": {
                "env": {
                    "kind": "simulator",
                    "class": "tests.workers_for_tests.Counter",
                    "replicas": env_replicas,
                    "args": {"num_envs": num_envs},
                },
                "policy": {"kind": "inference", "class": f"tests.workers_for_tests.{policy}"},
                "learner": {"kind": "training", "class": "tests.workers_for_tests.Collect"},
            },
            "flow": {
                "loop": {"horizon": horizon, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
                "then": ["env.trajectory -> learner.train"],
            },
            "placement": {"mode": mode, "pipeline_stages": stages, "offload": offload},
            "run": {"iterations": 2, "output_dir": str(tmp_path), "progress": False, **run},
        }
    )


@pytest.mark.parametrize(("mode", "stages"), [("shared", 1), ("hybrid", 3)])
def test_every_env_steps_every_step_in_order(tmp_path, mode, stages):
    result = mf.run(counter_workflow(tmp_path, mode=mode, stages=stages))
    last = result.last
    envs = 2 * 3
    assert last["envs"] == envs and last["ordered"] == 1.0
    # env i starts at 100*i and gains +1 per step: after 2 iterations of 5 steps, 100*i + 10
    assert last["final_sum"] == sum(100 * i + 10 for i in range(envs))
    assert last["env_steps"] == 2 * 5 * envs
    assert result.plan.pipeline_stages == stages
    assert (result.run_dir / "trace.json").exists() and (result.run_dir / "plan.json").exists()


def test_context_switches_run_in_the_order_the_plan_gives(tmp_path):
    result = mf.run(counter_workflow(tmp_path, offload="always"))
    planned = [(op, w) for phase in result.plan.phases for op in ("offload", "onload") for w in getattr(phase, op)]
    assert planned == [("offload", "learner"), ("onload", "policy"), ("offload", "policy"), ("onload", "learner")]
    events = json.loads((result.run_dir / "trace.json").read_text())["traceEvents"]
    swaps = sorted((e for e in events if e.get("cat") == "swap" and e["args"]["iteration"] == 1), key=lambda e: e["ts"])
    ran = list(dict.fromkeys((e["name"], e["args"]["worker"].split("[")[0]) for e in swaps))
    assert ran == planned
    assert result.last["policy/onloads"] == 2 and result.last["policy/offloads"] == 2
    assert result.last["time/swap_s"] > 0


def test_a_crashing_port_names_worker_port_and_cause(tmp_path):
    with pytest.raises(WorkerError) as info:
        mf.run(counter_workflow(tmp_path, policy="Crashing"))
    message = str(info.value)
    assert "worker 'policy' replica 0 failed in port 'act'" in message
    assert "policy exploded on purpose" in message


def test_a_worker_hung_in_a_call_is_reported_at_the_channel_deadline_its_beats_count_to(tmp_path):
    spec = counter_workflow(tmp_path, policy="Hanging", env_replicas=1, timeouts={"floor_s": 2.0, "start_s": 60.0})
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        mf.run(spec)
    assert time.monotonic() - began < 25
    message = str(info.value)
    # it sleeps in `act`, its replica beating: hung at the channel deadline, which comes from the plan (a few ms
    # per step, x20) and is held at the 2 s floor, its beats saying it is in a call (by the call's bound, or the
    # wait's own, whichever comes first)
    in_call = r"policy\[0\] has been in one call of policy\.act for 2\.\ds|no data from policy\[0\] for 2s, the most we"
    assert re.search(in_call, message), message
    assert "env.step input from policy.act (iteration 0)" in message


def test_a_worker_that_cannot_start_shows_its_own_error_without_ray_s_or_m2flow_s_frames(tmp_path):
    spec = counter_workflow(tmp_path, policy="FailsToStart")
    with pytest.raises(WorkerError) as info:
        mf.run(spec)
    message = str(info.value)
    assert re.search(r"worker 'policy' replica 0 failed to start", message)
    assert 'raise RuntimeError("cannot open the simulator, on purpose")' in message  # its own traceback
    assert "repr=" not in message and "m2flow/runtime/host.py" not in message, message


def test_seed_style_function_chain(tmp_path):
    from examples.seed_chain import run_llm_inference, run_physics_sim

    mf.define_worker(name="simulator", func=run_physics_sim, kind="simulator")
    mf.define_worker(name="inference", func=run_llm_inference, kind="inference")
    result = mf.run(
        workers=["simulator", "inference"],
        mode="hybrid",
        iterations=2,
        horizon=4,
        output_dir=str(tmp_path),
        progress=False,
    )
    assert result.iterations == 2 and result.plan.mode == "hybrid"
    assert result.plan.placements["simulator"].devices != result.plan.placements["inference"].devices
    events = json.loads((result.run_dir / "trace.json").read_text())["traceEvents"]
    loop = [e for e in events if e.get("cat") == "loop"]
    steps = {
        w: [(e["args"]["iteration"], e["args"].get("step", -1)) for e in loop if e["args"]["worker"] == w]
        for w in ("simulator[0]", "inference[0]")
    }
    # per iteration: the simulator's first observation (step -1), then 4 x (inference, simulator)
    assert steps["simulator[0]"] == [(it, t) for it in (0, 1) for t in (-1, 0, 1, 2, 3)]
    assert steps["inference[0]"] == [(it, t) for it in (0, 1) for t in (0, 1, 2, 3)]
    assert all(e["args"]["items"] == 4 for e in loop if e["args"].get("step", -1) >= 0)  # 4-element states


def test_steps_produced_equal_steps_consumed_or_the_run_says_so(tmp_path):
    ok = mf.run(counter_workflow(tmp_path, env_replicas=2, num_envs=3, horizon=5))
    assert ok.last["accounting/steps_produced"] == 2 * 3 * 5
    raw = counter_workflow(tmp_path).to_dict()
    raw["workers"]["learner"]["class"] = "tests.workers_for_tests.DropsOne"
    with pytest.raises(WorkerError, match="the loop produced 30 env steps but learner/steps_consumed reports 29"):
        mf.run(spec_from_dict(raw))
