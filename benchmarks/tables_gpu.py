"""Tables of benchmarks/RESULTS.md from the lent GPU machine's diagnostics: the policy's act call beside
simulator processes rendering through EGL (gpu_contention.py), and modes.py runs of one workload under
several machine settings (each run a file)."""

from __future__ import annotations

from typing import NamedTuple

from results_io import Results
from tables_format import Block, count, fixed, pct, table, times

CONTENTION = "gpu18/gpu_contention.json"
CONTENTION_4X48 = "gpu18/gpu_contention_4x48.json"
TILED, TILED_4X48 = "gpu18/gpu_contention_tiled.json", "gpu18/gpu_contention_tiled_4x48.json"
MPS = {  # one call, in this order (session 31)
    "gpu27/mps_off_shared.json": "no MPS",
    "gpu27/mps_off_hybrid2_k1.json": "no MPS",
    "gpu27/mps_on_hybrid2_k1.json": "CUDA MPS",
}
ONE_OFF_H100 = {  # one call on an H100 (session 31): synchronous shared, then one step off by mode
    "gpu27/h100/sync_shared.json": "H100",
    "gpu27/h100/async_k1.json": "H100",
}
ONE_OFF_H100_DEC06 = {  # the same pair on an H100, code 289615f (session 35)
    "gpu28/sync_shared.json": "H100",
    "gpu28/one_off_k1.json": "H100",
}
SIXTEEN_BY_12 = {"gpu28/modes_camera_vit_16x12.json": "H100, 16 x 12 envs"}  # a replica a core, synchronous
VIT_300M_SYNC = {"gpu29/modes_camera_vit300m_sync.json": "H100"}  # a ViT 300m, synchronous by mode (session 36)
ONE_OFF_300M = {  # the one-off pair with a ViT 300m, one call after it (session 36)
    "gpu29/sync_shared_300m.json": "H100",
    "gpu29/one_off_k1_300m.json": "H100",
}
GPU30 = "gpu30/"  # session 37, code 92b5b31 (the cheaper normaliser): call 1 on one H100, calls 3 and 4 on another
VIT_300M_NORM = {GPU30 + "modes_camera_vit300m_norm.json": "H100 (call 1)"}
ONE_OFF_100M_NORM = {
    GPU30 + "sync_shared_100m_norm.json": "H100 (call 3)",
    GPU30 + "one_off_k1_100m_norm.json": "H100 (call 3)",
}
ONE_OFF_100M_MPS = {  # the next call on the same machine, under a CUDA MPS daemon
    GPU30 + "sync_shared_100m_mps.json": "H100, MPS (call 4)",
    GPU30 + "one_off_k1_100m_mps.json": "H100, MPS (call 4)",
}

WHAT = {
    "physics": "physics only, no rendering",
    "render": "rendering through EGL",
    "yield": "rendering, GL driver sleeps while it waits",
    "low": "rendering, low-priority EGL contexts",
    "graph": "rendering; act replayed as a CUDA graph",
    "tiled": "rendering all envs into one frame buffer, one read-back",
}


def gpu_contention(rel: str, res: Results) -> Block:
    """Per variant: the act call's median latency beside the simulator processes against the policy alone, and
    the processes' frames/s without and while the policy acts."""
    data = res.json(rel)
    alone, args = data["alone"], data["args"]
    rows = []
    for row in data["rows"]:
        graph = row["variant"] == "graph"
        slice_alone = alone["graph_slice_ms" if graph else "act_slice_ms"]
        whole_alone = alone["graph_whole_ms" if graph else "act_whole_ms"]
        rendering = row["variant"] != "physics"
        rows.append(
            [
                WHAT[row["variant"]],
                row["priority"] or "—",
                f"{fixed(row['act_slice_ms'], 2)} ({times(row['act_slice_ms'] / slice_alone)})",
                f"{fixed(row['act_whole_ms'], 2)} ({times(row['act_whole_ms'] / whole_alone)})",
                count(row["fps_alone"]),
                count(row["fps_acting"]),
                times(row["fps_acting"] / row["fps_alone"]) if rendering else "—",
            ]
        )
    slices, whole = args["renderers"] * args["envs"] // 2, args["renderers"] * args["envs"]
    caption = (
        f"*{args['renderers']} simulator processes x {args['envs']} HalfCheetahs (84x84 camera, fast profile), each"
        f" pinned to a core of its own; a 100M ViT (bf16) acting on {slices} (slice) and {whole} (whole) observations"
        f" from host arrays in a process on its own core; alone it took {fixed(alone['act_slice_ms'], 2)} /"
        f" {fixed(alone['act_whole_ms'], 2)} ms, as a CUDA graph {fixed(alone['graph_slice_ms'], 2)} /"
        f" {fixed(alone['graph_whole_ms'], 2)} ms; medians over {args['seconds']:g} s each*"
    )
    header = ["simulator processes", "EGL priority", "act slice ms (vs alone)", "act whole ms (vs alone)"]
    header += ["frames/s, policy idle", "frames/s, policy acting", "frames kept"]
    return Block([caption, "", *table(header, rows, "llrrrrr")], [rel])


OVERLAP_WHERE = {
    "processes": "another process (as m2flow runs it today)",
    "threads": "a thread of the acting process, on the default stream (acting on its own, same priority)",
    "priority": "a thread of the acting process, on its own stream at the lowest priority (acting's highest)",
    "priority_short_switch": "as above, the GIL switched every 0.5 ms (not 5 ms)",
}


def training_overlap(rel: str, res: Results) -> Block:
    """Per variant: the act call's median latency and the update's steps/s while both run on the GPU, each against
    alone (gpu_training_overlap.py)."""
    data = res.json(rel)
    alone, args = data["alone"], data["args"]
    rows = [
        [
            OVERLAP_WHERE[row["variant"]],
            f"{fixed(row['act_ms'], 2)} ({times(row['act_vs_alone'])})",
            f"{fixed(row['update_per_s'], 2)} ({times(row['update_vs_alone'])})",
        ]
        for row in data["rows"]
    ]
    caption = (
        f"*a 100M ViT (bf16) acting on {data['act_batch']} camera observations from host arrays beside a PPO-shaped"
        f" update of another copy of it (minibatch {args['minibatch']:,}, bf16 autocast, AdamW) on the same GPU; alone"
        f" an act call took {fixed(alone['act_ms'], 2)} ms and the update {fixed(alone['update_per_s'], 2)} steps/s;"
        f" the act call's median over {args['seconds']:g} s a variant, the update's steps over the same window,"
        " acting's warm-up calls included*"
    )
    header = ["the update runs in", "act ms (vs alone)", "update steps/s (vs alone)"]
    return Block([caption, "", *table(header, rows, "lrr")], [rel])


class FirstRow(NamedTuple):
    """The first row of a table of runs, which the others are against."""

    measured_s: float
    loop_s: float


def pipeline_runs(runs: dict[str, str], res: Results) -> Block:
    """modes.py runs of the camera ViT workload made one after the other in one call, each under the setting
    `runs` names beside its file: iteration and loop time by mode and flow, against the first run's first row."""
    base = None
    rows = []
    for rel, setting in runs.items():
        staleness = res.json(rel)["args"].get("staleness", 0)
        flow = f"{staleness}-off" if staleness else "synchronous"
        for r in (r for r in res.rows(rel) if "measured_s" in r):
            base = base or FirstRow(r["measured_s"], r["loop_s"])
            rows.append(
                [setting, r["label"], flow, fixed(r["predicted_s"]), fixed(r["measured_s"]), pct(r["error"])]
                + [fixed(r["loop_s"]), fixed(r["physics_s"]), fixed(r["render_s"]), count(r["env_steps_per_s"])]
                + [times(base.measured_s / r["measured_s"]), times(base.loop_s / r["loop_s"])]
            )
    args = res.json(next(iter(runs)))["args"]
    caption = (
        f"*{args['replicas']} camera simulator processes x {args['envs']} envs (84x84 RGB + proprioception, EGL on"
        f" the GPU), ViT {args['size']} (patch 12, causal) acting in chunks of {args['chunk']} actions and training"
        " in bf16 on the GPU; no costs declared: each run measured those the cost cache did not hold (the first"
        f" run all of them); horizon {args['horizon']}, medians of the measured iterations; physics and render:"
        " seconds per"
        " simulator replica and iteration; the last two columns: the iteration and the loop against the first row's*"
    )
    header = ["setting", "mode", "flow", "predicted s", "measured s", "error", "loop s", "physics s", "render s"]
    header += ["env steps/s", "iteration vs first", "loop vs first"]
    return Block([caption, "", *table(header, rows, "lll" + "r" * 9)], list(runs))
