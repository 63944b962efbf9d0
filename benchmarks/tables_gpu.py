"""Tables of benchmarks/RESULTS.md from the lent GPU machine's diagnostics: the policy's act call beside
simulator processes rendering through EGL (gpu_contention.py)."""

from __future__ import annotations

from results_io import Results
from tables_format import Block, count, fixed, table, times

CONTENTION = "gpu18/gpu_contention.json"
CONTENTION_4X48 = "gpu18/gpu_contention_4x48.json"
TILED, TILED_4X48 = "gpu18/gpu_contention_tiled.json", "gpu18/gpu_contention_tiled_4x48.json"

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
