"""The figures benchmarks/RESULTS.md quotes in its prose: each a function of the raw outputs (Results) to a
string, named in FIGURES; render_results.py puts it between a `<!-- fig: NAME -->` marker pair."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from functools import partial

from results_io import Results, ResultsError, share_down
from results_tables import (
    BACKENDS,
    BEFORE_HOPS,
    CAMERA_CPU,
    CHANNELS,
    ENGINE,
    H200,
    H200_HOPS,
    H200_PROFILED,
    METAWORLD,
    OFFLOAD,
    PPO_H200,
    SPIN,
    X2,
    backend_key,
    ended,
)
from tables_format import pct, span, times
from tables_planner import PLANNER
from tables_recovery import CHAOS, CHAOS_SEED3, FAULTS, HOSTS

VIT, CHECK = "gpu6/vit_metrics.jsonl", "gpu7/ppo_camera_check_metrics.jsonl"
FSDP_100, MEGATRON_100 = ("fsdp", "100m", "bf16"), ("megatron", "100m", "bf16")
CKPT = "activation_checkpointing"


# --- engine_overhead.py, modes.py -------------------------------------------------------------------------------


def hop_ms(res: Results) -> float:
    """What two processes on one core add to a MuJoCo loop step: the round trip between them."""
    return step_ms("MuJoCo", "m2flow_steps_per_s", res) - step_ms("MuJoCo", "hand_steps_per_s", res)


def step_ms(prefix: str, key: str, res: Results) -> float:
    """Milliseconds per loop step (each of the case's envs stepped once) at the rate under `key`."""
    case = next(r for r in res.rows(ENGINE) if r["case"].startswith(prefix))
    return int(re.search(r"(\d+) envs?\)", case["case"])[1]) / case[key] * 1e3


def measured(rel: str, res: Results, stages: int | None = None) -> list[dict]:
    """The measured rows of a modes run, `auto` left out; only those with `stages` stages if given."""
    rows = [r for r in res.rows(rel) if "measured_s" in r and not r["label"].startswith("auto")]
    return [r for r in rows if stages in (None, r["stages"])]


def error_range(rel: str, res: Results, stages: int | None = None) -> str:
    return span([r["error"] for r in measured(rel, res, stages)], pct)


def worst_one_stage(rel: str, res: Results) -> str:
    return pct(max((r["error"] for r in measured(rel, res, 1)), key=abs))


def seconds_range(rel: str, key: str, res: Results) -> str:
    return span([r[key] for r in measured(rel, res)], lambda s: f"{s:.3f}")


def auto_pick(rel: str, res: Results) -> str:
    """What auto picked, and whether it was the fastest measured mode."""
    auto = next(r for r in res.rows(rel) if r.get("label", "").startswith("auto"))
    best = min(measured(rel, res), key=lambda r: r["measured_s"])
    picked = f"{auto['mode']} S={auto['stages']}"
    if picked == best["label"]:
        return f"{picked}, the fastest measured mode"
    return (
        f"{picked} ({auto['measured_s']:.3f} s), not the fastest measured: {best['label']} ({best['measured_s']:.3f} s)"
    )


def best_hybrid(rel: str, res: Results) -> str:
    best = max((r for r in measured(rel, res) if r["mode"] == "hybrid"), key=lambda r: r["vs_shared"])
    return f"{best['label']} at {times(best['vs_shared'])} shared, prediction error {pct(best['error'])}"


def spread(rel: str, res: Results, max_stages: int = 2) -> str:
    """How much slower the slowest mode of at most `max_stages` stages measured than the fastest."""
    seconds = [r["measured_s"] for r in measured(rel, res) if r["stages"] <= max_stages]
    return f"{max(seconds) / min(seconds) - 1:.1%}"


# --- planner.py; the per-port tables the CLI printed (*.txt) ----------------------------------------------------


def plan_growth(workers: int, res: Results, small: int = 256, large: int = 1024) -> str:
    plan_s = {r["gpus"]: r["plan_s"] for r in res.rows(PLANNER) if r["workers"] == workers and not r["allocation"]}
    return times(plan_s[large] / plan_s[small], 1)


def port_cell(rel: str, port: str, column: int, res: Results) -> str:
    """One cell (0 predicted, 1 measured, 2 ratio) of a per-port table as the CLI prints it."""
    match = re.search(rf"│ {re.escape(port)} +│(.*)│\s*$", res.text(rel), re.M)
    if match is None:
        raise ResultsError(f"{res.folder / rel}: no row {port!r} in its per-port table")
    return match[1].split("│")[column].strip()


# --- PPO runs (metrics.jsonl) -----------------------------------------------------------------------------------


def metric(rel: str, key: str, summary: Callable[[list], str], res: Results, keep: Callable = lambda r: True) -> str:
    """`summary` of the values of `key` over the iterations `keep` accepts."""
    return summary([r[key] for r in res.jsonl(rel) if keep(r)])


def median(fmt: str, scale: float = 1.0) -> Callable[[list], str]:
    return lambda values: fmt.format(statistics.median(values) * scale)


def ranged(fmt: str) -> Callable[[list], str]:
    return lambda values: span(values, fmt.format)


def metaworld_successes(res: Results) -> str:
    logged = ended(res.jsonl(METAWORLD))
    return f"{sum(r['env/success_rate'] > 0 for r in logged)} of the {len(logged)}"


# --- channels.py, backends.py -----------------------------------------------------------------------------------


def channel_ms(cost: Callable[[dict], float], res: Results) -> str:
    return span([cost(r) for rel in CHANNELS for r in res.rows(rel)], lambda ms: f"{ms:.2f} ms")


def backend_ratio(rel: str, key: str, a: tuple, b: tuple, res: Results, digits: int = 2, rel_b: str = "") -> str:
    """`key` of the row `a` (backend, size, precision[, options]) over that of row `b` (in `rel_b` if given)."""

    def row(file: str, want: tuple) -> dict:
        return next(r for r in res.rows(file) if backend_key(r) == (*want, "-")[:4])

    return times(row(rel, a)[key] / row(rel_b or rel, b)[key], digits)


def parity(rel: str, res: Results) -> str:
    found = res.json(rel)["parity"]
    return " / ".join(f"{found[key]:.2g}" for key in ("logprob", "value", "synced_logprob", "synced_value"))


def rerun_spread(res: Results) -> str:
    """Range of the re-runs' samples/s over the first call's, on the rows the first call has."""
    first = {backend_key(r): r["samples_per_s"] for r in res.rows(BACKENDS[0]) if r["size"] == "10m"}
    reruns = [r for rel in BACKENDS[1:] for r in res.rows(rel) if backend_key(r) in first]
    return span([r["samples_per_s"] / first[backend_key(r)] - 1 for r in reruns], "{:+.0%}".format)


def chaos_line(name: str, res: Results) -> str:
    """The benchmark's last line, from its raw output (the throughput rounded down, as chaos.py prints it)."""
    s = res.json(name)["summary"]
    return (
        f"`chaos: {s['faults']} faults, {s['detected']} detected, {s['in_place']} in place, {s['by_restart']} by"
        f" restart, {s['checkpoints_lost']} checkpoints lost, throughput {share_down(s['throughput_ratio'])} of"
        " fault-free`"
    )


def hosts_line(res: Results) -> str:
    """The benchmark's last line, from its raw output."""
    runs = res.json(HOSTS)["runs"]

    def seconds(value: float | None) -> str:
        return "not seen" if value is None else f"{value:.1f} s"

    struck = "; ".join(
        f"{o['fault']} detected in {seconds(o['detected_s'])}, back in {seconds(o['back_s'])}"
        for o in runs
        if o["fault"] != "none"
    )
    lost, unaccounted = (sum(o[key] for o in runs) for key in ("checkpoints_lost", "env_steps_unaccounted"))
    return f"`hosts: {struck}; {lost} checkpoints lost, {unaccounted} env steps unaccounted`"


# --- registry ---------------------------------------------------------------------------------------------------


FIGURES: dict[str, Callable[[Results], str]] = {
    "engine.colocated_range": lambda res: span([r["colocated_ratio"] for r in res.rows(ENGINE)], times),
    "engine.mujoco_work_ms": lambda res: f"{step_ms('MuJoCo', 'hand_steps_per_s', res):.2f}",
    "engine.mujoco_hop_ms": lambda res: f"{hop_ms(res):.2f}",
    "engine.cheap_step_ms": lambda res: f"{step_ms('cheap', 'hand_steps_per_s', res):.2f}",
    "modes_spin.errors": partial(error_range, SPIN),
    "modes_spin.pick": partial(auto_pick, SPIN),
    "modes_spin.best_hybrid": partial(best_hybrid, SPIN),
    "modes_before_hops.errors": partial(error_range, BEFORE_HOPS),
    "modes_before_hops.best_hybrid": partial(best_hybrid, BEFORE_HOPS),
    "modes_camera_cpu.predicted": partial(seconds_range, CAMERA_CPU, "predicted_s"),
    "modes_camera_cpu.measured": partial(seconds_range, CAMERA_CPU, "measured_s"),
    "modes_camera_cpu.pick": partial(auto_pick, CAMERA_CPU),
    "planner.growth_3": partial(plan_growth, 3),
    "planner.growth_5": partial(plan_growth, 5),
    "chaos.line": partial(chaos_line, CHAOS),
    "chaos_seed3.line": partial(chaos_line, CHAOS_SEED3),
    "chaos_spares.line": partial(chaos_line, "chaos_spares.json"),
    "chaos_seed3_spares.line": partial(chaos_line, "chaos_seed3_spares.json"),
    "chaos_seed3_beats.line": partial(chaos_line, "chaos_seed3_beats.json"),
    "chaos_seed3_final.line": partial(chaos_line, "chaos_seed3_final.json"),
    "chaos_final.line": partial(chaos_line, "chaos_final.json"),
    "chaos_seed1.line": partial(chaos_line, "chaos_seed1.json"),
    "chaos_streamed_part_collective.line": partial(chaos_line, "chaos_streamed_part_collective.json"),
    "hosts.line": hosts_line,
    "faults.completed": lambda res: f"{sum(r['completed'] for r in res.rows(FAULTS))}/{len(res.rows(FAULTS))}",
    "faults.median_detection": lambda res: f"{statistics.median(r['detection_s'] for r in res.rows(FAULTS)):.2f} s",
    "h200.ablation_env_step": partial(port_cell, "gpu/ablation.txt", "env.step", 2),
    "h200.ablation_policy_act": partial(port_cell, "gpu/ablation.txt", "policy.act", 2),
    "h200.ppo_rollout_act": partial(port_cell, "gpu/ppo_camera.txt", "rollout.act", 2),
    "h200.one_stage_errors": partial(error_range, H200, stages=1),
    "h200.spread": partial(spread, H200),
    "h200.worst_one_stage": partial(worst_one_stage, H200),
    "h200_profiled.one_stage_errors": partial(error_range, H200_PROFILED, stages=1),
    "h200_profiled.worst_one_stage": partial(worst_one_stage, H200_PROFILED),
    "h200_profiled.pick": partial(auto_pick, H200_PROFILED),
    "h200_hops.worst_one_stage": partial(worst_one_stage, H200_HOPS),
    "h200_hops.pick": partial(auto_pick, H200_HOPS),
    "h200.ppo_steps_per_s": partial(metric, PPO_H200, "env/steps_per_s", median("{:,.0f}")),
    "h200.ppo_swap_ms": partial(metric, PPO_H200, "time/swap_s", median("{:.0f}", scale=1e3)),
    "metaworld.minutes": partial(metric, METAWORLD, "time/iteration_s", lambda v: f"{sum(v) / 60:.1f}"),
    "metaworld.s_per_iteration": partial(metric, METAWORLD, "time/iteration_s", lambda v: f"{statistics.mean(v):.1f}"),
    "metaworld.successes": metaworld_successes,
    "channels.compiled_gap": partial(channel_ms, lambda r: r["compiled"] - r["m2flow"]),
    "channels.m2flow_over_work": partial(channel_ms, lambda r: r["m2flow"] - 2 * r["work_ms"]),
    "backends.parity": partial(parity, BACKENDS[0]),
    "backends.bf16_100m": partial(backend_ratio, BACKENDS[0], "samples_per_s", FSDP_100, ("fsdp", "100m", "fp32")),
    "backends.bf16_10m": lambda res: " / ".join(
        backend_ratio(rel, "samples_per_s", ("fsdp", "10m", "bf16"), ("fsdp", "10m", "fp32"), res) for rel in BACKENDS
    ),
    "backends.megatron_bf16": partial(backend_ratio, BACKENDS[0], "samples_per_s", MEGATRON_100, FSDP_100),
    "backends.megatron_fp32": partial(
        backend_ratio, BACKENDS[0], "samples_per_s", ("megatron", "100m", "fp32"), ("fsdp", "100m", "fp32")
    ),
    "backends.ckpt_memory": lambda res: " / ".join(
        backend_ratio(BACKENDS[0], "peak_gib", row, (*row, CKPT), res, 1) for row in (FSDP_100, MEGATRON_100)
    ),
    "backends.ckpt_time": lambda res: " / ".join(
        backend_ratio(BACKENDS[0], "update_s", (*row, CKPT), row, res) for row in (FSDP_100, MEGATRON_100)
    ),
    "backends.offload_time": partial(
        backend_ratio, OFFLOAD, "update_s", (*FSDP_100, "cpu_offload"), FSDP_100, digits=1, rel_b=BACKENDS[0]
    ),
    "backends.rerun_parity": lambda res: f"{parity(BACKENDS[1], res)} (gpu9), {parity(BACKENDS[2], res)} (gpu10)",
    "backends.rerun_spread": rerun_spread,
    "vit.s_per_iteration": partial(metric, VIT, "time/iteration_s", median("{:.1f}")),
    "vit.resumed_versions": lambda res: ", ".join(f"{r['actor/weights_version']:.0f}" for r in res.jsonl(VIT)[3:]),
    "vit.resumed_kl": partial(metric, VIT, "actor/approx_kl", ranged("{:.3f}"), keep=lambda r: r["iteration"] >= 3),
    "check.parts": partial(metric, CHECK, "actor/parts_streamed", ranged("{:.0f}")),
    "check.iteration_s": partial(
        metric, CHECK, "time/iteration_s", ranged("{:.1f}"), keep=lambda r: "eval/return" not in r
    ),
    "check.eval_iteration_s": partial(
        metric, CHECK, "time/iteration_s", ranged("{:.1f}"), keep=lambda r: "eval/return" in r and r["iteration"] > 0
    ),
    "check.evaluate_s": partial(port_cell, "gpu7/ppo_camera_check.txt", "env.evaluate", 1),
    "x2.busy": lambda res: " / ".join(port_cell("gpu8/modes.txt", f"busy n0/gpu{i}", 1, res) for i in (0, 1)),
    "x2.spread": partial(spread, X2),
    "x2.pick": partial(auto_pick, X2),
}
