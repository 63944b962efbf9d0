"""The tables of benchmarks/RESULTS.md: each a function of the raw outputs (Results) to a Block, named in TABLES.

A table function reads its files through `Results` and returns the table's lines and the files it read;
render_results.py puts them between a `<!-- table: NAME -->` marker pair. The file names below are also
what results_figures.py reads.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from functools import partial

from results_io import Results
from tables_format import Block, count, fixed, pct, table, times
from tables_gpu import (
    CONTENTION,
    CONTENTION_4X48,
    MPS,
    ONE_OFF_100M_MPS,
    ONE_OFF_100M_NORM,
    ONE_OFF_300M,
    ONE_OFF_H100,
    ONE_OFF_H100_DEC06,
    SIXTEEN_BY_12,
    TILED,
    TILED_4X48,
    VIT_300M_NORM,
    VIT_300M_SYNC,
    gpu_contention,
    pipeline_runs,
    training_overlap,
)
from tables_learning import learning, locomotion
from tables_planner import PLANNER_TABLES, cost_cache, make_run_table, merging, threads
from tables_recovery import (
    CHAOS,
    CHAOS_FINAL,
    CHAOS_SEED1,
    CHAOS_SEED3,
    CHAOS_SEED3_FINAL,
    CHAOS_SEED3_SPARES,
    CHAOS_SPARES,
    chaos_faults,
    chaos_summary,
    faults,
    hosts,
    replacement_spares,
)
from tables_simulators import ablation, physics_scaling, step_cost
from tables_sync import (
    CAMERA_VIT,
    CAMERA_VIT_STORE,
    SYNC_CPU,
    SYNC_H200,
    SYNC_X2,
    camera_vit_sync,
    weight_sync,
    weight_sync_by_commit,
)

ENGINE = "engine_overhead.json"
SPIN, BEFORE_HOPS, CAMERA_CPU = "modes_spin.json", "modes.json", "modes_camera.json"
H200, H200_PROFILED, H200_HOPS, X2 = (f"{d}/modes_camera.json" for d in ("gpu", "gpu2", "gpu3", "gpu8"))
METAWORLD, PPO_H200 = "ppo_metaworld_camera_metrics.jsonl", "gpu/ppo_camera_metrics.jsonl"
CHANNELS = ["channels.json", "gpu4/channels.json"]
BACKENDS = ["gpu5/backends.json", "gpu9/backends.json", "gpu10/backends.json"]
OFFLOAD, MULTIGPU = "gpu5/backends_offload.json", "gpu8/multigpu.json"
HF_H200 = "gpu13/hf_policy.json"
LEARNING, ASYNC_H200 = "learning_halfcheetah.json", "gpu15/async_halfcheetah_h200.json"
LOCOMOTION = ("hopper", "walker2d", "ant")  # learning_<task>_300k.json: locomotion.sh's runs, merged
OBS_STATISTICS = "learning_halfcheetah_obs_statistics.json"  # locomotion.sh, HalfCheetah per env vs shared
ASYNC_CPU_SHARED_FIRST, ASYNC_CPU = "async_halfcheetah_shared_first.json", "async_halfcheetah.json"
LEARNING_SAC, LEARNING_SAC_100K = "learning_sac_halfcheetah_30k.json", "learning_sac_halfcheetah_100k.json"
ASYNC_H200_DROP, ASYNC_H200_KOFF = "gpu16/async_halfcheetah_h200.json", "gpu16/koff/async_halfcheetah_h200.json"
HF_X2_256, HF_X2_1024 = "gpu12/multigpu_hf_256.json", "gpu12/multigpu_hf_1024.json"


# --- engine_overhead.py, modes.py -------------------------------------------------------------------------------


def engine_overhead(res: Results) -> Block:
    rows = [
        [r["case"], count(r["hand_steps_per_s"]), count(r["m2flow_steps_per_s"]), times(r["ratio"])]
        + [count(r["m2flow_colocated_steps_per_s"]), times(r["colocated_ratio"])]
        + ([count(r["m2flow_hybrid_s2_steps_per_s"]), times(r["hybrid_ratio"])] if "hybrid_ratio" in r else ["—"] * 2)
        for r in res.rows(ENGINE)
    ]
    header = ["case", "hand-written env steps/s", "(b) two processes", "ratio", "(c) colocated", "ratio"]
    return Block(table([*header, "(d) hybrid S=2", "ratio"], rows, "lrrrrrrr"), [ENGINE])


PROFILE_SOURCE = {  # (workload, --measure) -> where the planner's costs came from
    ("spin", False): "costs declared: the synthetic workers' true costs",
    ("camera", True): "costs measured first by `m2flow profile`",
    ("camera", False): "costs neither declared nor measured (no `--measure`): the planner's defaults by worker kind",
}
WORKLOAD_SETUP = {
    "spin": "simulator {step_ms:g} ms a step, policy {act_ms:g} ms a call ({act_fixed_frac:.0%} of it fixed),"
    " trainer {train_ms:g} ms",
    "camera": "{replicas} camera simulator processes",
}


def modes_table(rel: str, res: Results) -> Block:
    args = {"workload": "spin", **res.json(rel)["args"]}
    source, setup = PROFILE_SOURCE[(args["workload"], bool(args.get("measure")))], WORKLOAD_SETUP[args["workload"]]
    caption = f"*{source}; {setup.format(**args)}; horizon {args['horizon']}, {args['iterations']} iterations.*"
    header = ["mode", "predicted s", "measured s", "error", "env steps/s", "vs shared"]
    efficiencies = [r.get("pipeline_efficiency", math.nan) for r in res.rows(rel)]
    efficiency = int(not all(math.isnan(e) for e in efficiencies))  # a column only where the run computed it
    rows = []
    for r in res.rows(rel):
        if "measured_s" not in r:
            reason = r["infeasible"].split(": ", 1)[-1].split(";")[0]
            rows.append(
                [f"{r['mode']} S={r['stages']}", f"infeasible: {reason}"] + [""] * (len(header) + efficiency - 2)
            )
            continue
        cells = [fixed(r["predicted_s"]), fixed(r["measured_s"]), pct(r["error"]), count(r["env_steps_per_s"])]
        rows.append([r["label"], *cells, times(r["vs_shared"])] + [fixed(r["pipeline_efficiency"], 2)] * efficiency)
    header += ["pipeline efficiency"] * efficiency
    return Block([caption, "", *table(header, rows, "l" + "r" * (len(header) - 1))], [rel])


# --- planner.py, faults.py, simulator_ablation.py ---------------------------------------------------------------


# --- PPO runs (metrics.jsonl) -----------------------------------------------------------------------------------


def ended(history: list[dict]) -> list[dict]:
    """The iterations in which some episodes ended (and so logged a return)."""
    return [r for r in history if "env/episode_return" in r]


def ppo_camera_h200(res: Results) -> Block:
    rows = [
        [str(r["iteration"]), count(r["env_steps"]), count(r["env/episode_return"])] for r in ended(res.jsonl(PPO_H200))
    ]
    return Block(table(["iteration", "env steps", "mean episode return"], rows, "rrr"), [PPO_H200])


def ppo_metaworld(res: Results, block: int = 30) -> Block:
    history, rows = res.jsonl(METAWORLD), []
    for start in range(0, len(history), block):
        part = history[start : start + block]
        returns, success = [r["env/episode_return"] for r in ended(part)], [r["env/success_rate"] for r in ended(part)]
        cells = [
            count(statistics.mean(returns)),
            count(max(returns)),
            str(sum(s > 0 for s in success)),
            fixed(max(success)),
        ]
        rows.append(
            [f"{part[0]['iteration']}-{part[-1]['iteration']}", count(part[-1]["env_steps"]), str(len(returns)), *cells]
        )
    header = ["iterations", "env_steps at end", "iterations with ended episodes", "mean return", "best return"]
    return Block(table([*header, "of them with a success", "best success rate"], rows, "lrrrrrr"), [METAWORLD])


# --- channels.py, backends.py, multigpu.py ----------------------------------------------------------------------


def channels(res: Results) -> Block:
    rows = [
        [f"{res.json(rel)['cores']} cores", f"{r['work_ms']:g} ms"]
        + [f"{r[kind]:.3f} ms" for kind in ("driver", "compiled", "m2flow")]
        + [f"{r['m2flow'] - 2 * r['work_ms']:.3f} ms"]
        for rel in CHANNELS
        for r in res.rows(rel)
    ]
    header = ["machine", "work per side", "driver", "compiled graph", "m2flow channel", "m2flow over the work"]
    return Block(table(header, rows, "lrrrrr"), CHANNELS)


BACKEND_OPTIONS = {"-": "—", "activation_checkpointing": "activation checkpointing", "cpu_offload": "CPU offload"}


def backends(res: Results) -> Block:
    rows = [
        [r["backend"], r["size"], f"{r['params_m']:.1f}M", r["precision"], BACKEND_OPTIONS[r["options"]]]
        + [f"{r['update_s']:.3f} s", count(r["samples_per_s"]), f"{r['peak_gib']:.2f} GiB"]
        for rel in (BACKENDS[0], OFFLOAD)
        for r in res.rows(rel)
    ]
    header = ["backend", "size", "params", "precision", "options", "update", "samples/s", "peak"]
    return Block(table(header, rows, "lllllrrr"), [BACKENDS[0], OFFLOAD])


def backend_key(r: dict) -> tuple:
    return r["backend"], r["size"], r["precision"], r["options"]


def backends_10m(res: Results) -> Block:
    """The 10M rows of the three calls side by side: samples/s, and each re-run over the first call."""
    runs = [{backend_key(r): r["samples_per_s"] for r in res.rows(rel) if r["size"] == "10m"} for rel in BACKENDS]
    rows = []
    for key in dict.fromkeys(k for run in runs for k in run):
        rates = [run.get(key) for run in runs]
        cells = [count(rate) if rate else "—" for rate in rates]
        cells += [times(rate / rates[0]) if rate and rates[0] else "—" for rate in rates[1:]]
        rows.append([key[0], key[2], BACKEND_OPTIONS[key[3]], *cells])
    header = ["backend", "precision", "options", "samples/s gpu5", "gpu9", "gpu10", "gpu9 / gpu5", "gpu10 / gpu5"]
    return Block(table(header, rows, "lllrrrrr"), BACKENDS)


def multigpu(rel: str, res: Results) -> Block:
    rows = [
        [r["backend"], str(r["ranks"]), ", ".join(r["devices"]), f"{r['update_s']:.3f}", count(r["samples_per_s"])]
        + [times(r["speedup_vs_1"]), f"{r['max_abs_diff_vs_1']:.1e}" if r["ranks"] > 1 else "—"]
        for r in res.rows(rel)
    ]
    header = ["backend", "ranks", "GPUs", "s / update", "samples/s", "vs 1 rank", "max abs weight difference vs 1 rank"]
    return Block(table(header, rows, "lrlrrrr"), [rel])


# --- hf_policy.py, learning.py -------------------------------------------------------------


def hf_policy(res: Results) -> Block:
    data = res.json(HF_H200)
    rows = [
        [
            r["precision"],
            r["options"],
            str(r["minibatch"]),
            f"{r['trainable_m']:.1f}M",
            fixed(r["update_s"]),
            fixed(r["samples_per_s"], 1),
            fixed(r["peak_gib"], 1),
            fixed(r["estimate_gib"], 1),
            pct(r["estimate_gib"] / r["peak_gib"] - 1),
            fixed(r["weights_mib"], 1),
        ]
        for r in data["rows"]
        if "update_s" in r
    ]
    loop = data["loop"]
    params = next(r["params_m"] for r in data["rows"] if "params_m" in r)
    caption = (
        f"*a {params:.0f}M-parameter VLM policy; one PPO update (1 epoch) of a real camera rollout:"
        f" {loop['envs']} HalfCheetahs x {loop['steps']} steps rendered by MuJoCo on the GPU, the inference"
        f" worker's act() {loop['act_ms']:.0f} ms per step (fp32); peak memory beside the planner's estimate;"
        f" `{data['summary']}`*"
    )
    header = [
        "precision",
        "options",
        "minibatch",
        "trained",
        "update s",
        "samples/s",
        "peak GiB",
        "estimate GiB",
        "estimate error",
        "synced MiB",
    ]
    return Block([caption, "", *table(header, rows, "llrrrrrrrr")], [HF_H200])


# --- registry ---------------------------------------------------------------------------------------------------


def camera_gpu_pipeline(rel: str, res: Results, calibrated_async: bool = False) -> Block:
    """The camera workload with a ViT acting and training on the GPU, by mode: iteration and loop time.
    `calibrated_async`: an asynchronous run whose first mode measured the costs in synchronous iterations."""
    args = res.json(rel)["args"]
    rows = [
        [r["label"], fixed(r["predicted_s"]), fixed(r["measured_s"]), pct(r["error"])]
        + [fixed(r["loop_s"]), fixed(r["sync_s"]), count(r["env_steps_per_s"]), times(r["vs_shared"])]
        for r in res.rows(rel)
        if "measured_s" in r
    ]
    chunk, staleness = args.get("chunk", 1), args.get("staleness", 0)
    acting = f"acting in chunks of {chunk} actions" if chunk > 1 else "acting"
    training = f"training {staleness} policy version(s) behind the loop (decoupled PPO)" if staleness else "training"
    measured = (
        "the first run measured them in its first 3 iterations, run synchronously (the asynchronous flow's"
        " calibration), and cached them, the later runs started from the cache; horizon"
        f" {args['horizon']}, {args['iterations']} iterations, medians of the asynchronous ones after the first*"
        if calibrated_async
        else "the first run measured them in its first iterations and cached them, the later runs started"
        f" from the cache; horizon {args['horizon']}, {args['iterations']} iterations, medians after the first*"
    )
    caption = (
        f"*{args['replicas']} camera simulator processes x {args['envs']} envs (84x84 RGB + proprioception, EGL on"
        f" the GPU), ViT {args['size']} (patch 12, causal) {acting} and {training} in bf16 on the GPU; no costs"
        f" declared: {measured}"
    )
    header = ["mode", "predicted s", "measured s", "error", "loop s", "sync s", "env steps/s", "vs shared"]
    return Block([caption, "", *table(header, rows, "lrrrrrrr")], [rel])


TABLES: dict[str, Callable[[Results], Block]] = {
    **PLANNER_TABLES,
    "engine_overhead": engine_overhead,
    "modes_spin": partial(modes_table, SPIN),
    "modes_spin_before_hops": partial(modes_table, BEFORE_HOPS),
    "modes_camera_cpu": partial(modes_table, CAMERA_CPU),
    "faults": faults,
    "chaos_faults": partial(chaos_faults, CHAOS),
    "chaos_summary": partial(chaos_summary, CHAOS),
    "chaos_seed3_faults": partial(chaos_faults, CHAOS_SEED3),
    "chaos_spares_faults": partial(chaos_faults, CHAOS_SPARES),
    "chaos_spares_summary": partial(chaos_summary, CHAOS_SPARES),
    "chaos_seed3_spares_faults": partial(chaos_faults, CHAOS_SEED3_SPARES),
    "chaos_seed3_spares_summary": partial(chaos_summary, CHAOS_SEED3_SPARES),
    "chaos_seed3_final_faults": partial(chaos_faults, CHAOS_SEED3_FINAL),
    "chaos_seed3_final_summary": partial(chaos_summary, CHAOS_SEED3_FINAL),
    "chaos_final_faults": partial(chaos_faults, CHAOS_FINAL),
    "chaos_final_summary": partial(chaos_summary, CHAOS_FINAL),
    "chaos_seed1_faults": partial(chaos_faults, CHAOS_SEED1),
    "chaos_seed1_summary": partial(chaos_summary, CHAOS_SEED1),
    "chaos_seed3_summary": partial(chaos_summary, CHAOS_SEED3),
    "hosts": hosts,
    "replacement_spares": replacement_spares,
    "ablation_metaworld": partial(ablation, "simulator_ablation_metaworld.json"),
    "step_cost": partial(step_cost, "step_cost.json"),
    "physics_scaling_h100": partial(physics_scaling, "gpu29/physics_scaling.json"),
    "ablation_cheetah_h200": partial(ablation, "gpu/simulator_ablation_cheetah.json"),
    "ablation_cheetah_vit_h200": partial(ablation, "gpu19/simulator_ablation_cheetah_vit.json"),
    "ablation_cheetah_vit_h200_dec05": partial(ablation, "gpu26/simulator_ablation_cheetah_vit.json"),
    "ablation_cheetah_vit300m_h100": partial(ablation, "gpu29/simulator_ablation_cheetah_vit_300m.json"),
    "ablation_cheetah_vit300m_32_chunks_h100": partial(
        ablation, "gpu29/simulator_ablation_cheetah_vit_300m_32chunks.json"
    ),
    "ablation_cheetah_vit300m_32_chunks_norm_h100": partial(
        ablation, "gpu30/simulator_ablation_cheetah_vit_300m_32chunks_norm.json"
    ),
    "ablation_cheetah_vit300m_stages_h100": partial(
        ablation, "gpu30/simulator_ablation_cheetah_vit_300m_32chunks_stages.json"
    ),
    "modes_camera_h200": partial(modes_table, H200),
    "modes_camera_h200_profiled": partial(modes_table, H200_PROFILED),
    "modes_camera_h200_hops": partial(modes_table, H200_HOPS),
    "ppo_camera_h200": ppo_camera_h200,
    "ppo_metaworld": ppo_metaworld,
    "channels": channels,
    "backends": backends,
    "backends_10m_reruns": backends_10m,
    "multigpu": partial(multigpu, MULTIGPU),
    "modes_camera_x2": partial(modes_table, X2),
    "make_run_table": partial(make_run_table, "make_run_table.json"),
    "make_run_table_6dcebe7": partial(make_run_table, "make_run_table_6dcebe7/make_run_table.json"),
    "make_run_table_04ecb42": partial(make_run_table, "make_run_table_04ecb42/make_run_table.json"),
    "make_run_table_904683f": partial(make_run_table, "make_run_table_904683f/make_run_table.json"),
    "make_run_table_bbb2a4a": partial(make_run_table, "make_run_table_bbb2a4a/make_run_table.json"),
    "make_run_table_b87a762": partial(make_run_table, "make_run_table_b87a762/make_run_table.json"),
    "make_run_table_before_6dcebe7": partial(make_run_table, "make_run_table_before_6dcebe7/make_run_table.json"),
    "cost_cache_quiet": partial(cost_cache, "cost_cache_quiet.json"),
    "cost_cache_disturbed": partial(cost_cache, "cost_cache_disturbed.json"),
    "gpu_contention_h200": partial(gpu_contention, CONTENTION),
    "gpu_contention_h200_4x48": partial(gpu_contention, CONTENTION_4X48),
    "gpu_contention_h200_tiled": partial(gpu_contention, TILED),
    "gpu_contention_h200_tiled_4x48": partial(gpu_contention, TILED_4X48),
    "pipeline_mps_h200": partial(pipeline_runs, MPS),
    "pipeline_one_off_h100": partial(pipeline_runs, ONE_OFF_H100),
    "pipeline_one_off_h100_dec06": partial(pipeline_runs, ONE_OFF_H100_DEC06),
    "pipeline_16x12_h100": partial(pipeline_runs, SIXTEEN_BY_12),
    "pipeline_vit300m_h100": partial(pipeline_runs, VIT_300M_SYNC),
    "pipeline_one_off_vit300m_h100": partial(pipeline_runs, ONE_OFF_300M),
    "pipeline_vit300m_norm_h100": partial(pipeline_runs, VIT_300M_NORM),
    "pipeline_one_off_vit100m_norm_h100": partial(pipeline_runs, ONE_OFF_100M_NORM),
    "pipeline_one_off_vit100m_mps_h100": partial(pipeline_runs, ONE_OFF_100M_MPS),
    "weight_sync_h100_by_commit": partial(
        weight_sync_by_commit, ["gpu28/weight_sync_13cb13c.json", "gpu28/weight_sync_289615f.json"]
    ),
    "weight_sync_h200_by_commit": partial(
        weight_sync_by_commit, ["gpu27/weight_sync_a5c72fe.json", "gpu27/weight_sync_4a50f4c.json"]
    ),
    "gpu_training_overlap_h100": partial(training_overlap, "gpu31/gpu_training_overlap.json"),
    "gpu_training_overlap_h100_first": partial(training_overlap, "gpu31/gpu_training_overlap_first.json"),
    "hf_policy_h200": hf_policy,
    "learning": partial(learning, LEARNING),
    **{f"locomotion_{task}": partial(locomotion, f"learning_{task}_300k.json") for task in LOCOMOTION},
    "obs_statistics_halfcheetah": partial(learning, OBS_STATISTICS),
    "learning_three_way": partial(learning, "learning_halfcheetah_three_way.json"),
    **{
        f"learning_pixels_{run}": partial(learning, f"learning_halfcheetah_pixels_{run}.json")
        for run in ("h200", "h200_100k", "2core")
    },
    "locomotion_hopper_seeds_4_6": partial(locomotion, "learning_hopper_300k_seeds_4_6.json"),
    "async_cpu_shared_first": partial(learning, ASYNC_CPU_SHARED_FIRST),
    "learning_sac": partial(learning, LEARNING_SAC),
    "learning_sac_100k": partial(learning, LEARNING_SAC_100K),
    "async_cpu": partial(learning, ASYNC_CPU),
    "async_h200": partial(learning, ASYNC_H200),
    "async_h200_drop": partial(learning, ASYNC_H200_DROP),
    "async_h200_koff": partial(learning, ASYNC_H200_KOFF),
    "weight_sync": partial(weight_sync, [SYNC_CPU, SYNC_H200, SYNC_X2]),
    "weight_sync_h200_dec05": partial(weight_sync, ["gpu26/weight_sync.json"]),
    "weight_sync_cpu_checksum": partial(
        weight_sync_by_commit, ["weight_sync_cpu_a5c72fe.json", "weight_sync_cpu_d7a61c7.json"]
    ),
    "camera_vit_sync_h200": partial(camera_vit_sync, [CAMERA_VIT_STORE, CAMERA_VIT]),
    "camera_gpu_pipeline_h200": partial(camera_gpu_pipeline, "gpu13/modes_camera_vit_bf16.json"),
    **{
        f"camera_gpu_pipeline_h200_{run}": partial(camera_gpu_pipeline, f"gpu19/modes_camera_vit_{run}.json")
        for run in ("chunk8", "chunk16", "chunk16_async")
    },
    "camera_gpu_pipeline_h200_chunk16_merged": partial(
        camera_gpu_pipeline, "gpu26/modes_camera_vit_chunk16_merged.json"
    ),
    "camera_gpu_pipeline_h200_chunk16_async_calibrated": partial(
        camera_gpu_pipeline, "gpu20/modes_camera_vit_chunk16_async_calibrated.json", calibrated_async=True
    ),
    "multigpu_hf_x2_256": partial(multigpu, HF_X2_256),
    "multigpu_hf_x2_1024": partial(multigpu, HF_X2_1024),
    "merging": merging,
    "threads": partial(threads, "threads.json"),
    "threads_metaworld": partial(threads, "threads_metaworld.json"),
    "threads_sac": partial(threads, "threads_sac.json"),
}
