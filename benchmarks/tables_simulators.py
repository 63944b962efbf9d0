"""Tables of benchmarks/RESULTS.md about a simulator's step: the BEHAVIOR ablation's rows
(simulator_ablation.py), what the observation normaliser adds to a physics step (step_cost.py), and how physics
slows with more processes at once (physics_scaling.py)."""

from __future__ import annotations

from results_io import Results
from tables_format import Block, fixed, table, times

ABLATION_CHANGES = {  # row -> what it changes over the previous one
    "baseline": "full rendering; every camera x RGB, depth, segmentation; observations every step",
    "slim": "fast rendering; only the RGB images the policy reads",
    "+ chunk end": "observations only at the end of each {chunk}-action chunk",
    "+ pipeline": "S={stages}, simulator and inference on separate cores (hybrid)",
}


def ablation(rel: str, res: Results) -> Block:
    args = res.json(rel)["args"]
    first = args.get("first_row", "baseline")
    digits = 1 if first == "baseline" else 2  # from a later row the cumulative figures are small: 1.56x, not 1.6x
    rows = [
        [
            r["row"],
            ABLATION_CHANGES[r["row"]].format(**{"stages": 2, **args, **r}),  # S=2 before rows carried their stages
            fixed(r["ms_per_step"]),
            times(r["speedup"]) if i else "—",
        ]
        + [times(r["cumulative"], digits), times(r["published"], 1) if r["published"] else "—"]
        for i, r in enumerate(res.rows(rel))
    ]
    envs = (
        f"{args['replicas']} simulator processes x {args['envs']} envs"
        if args.get("replicas", 1) > 1
        else f"{args['envs']} envs"
    )
    policy = f", a ViT {args['vit_size']} acting in bf16" if args.get("policy") == "vit" else ""
    caption = f"*task {args['task']}, {envs}{policy}, {args['chunks']} chunks of {args['chunk']} actions an"
    caption += f" iteration, {args['size']}x{args['size']} images; rows are cumulative"
    caption += "" if first == "baseline" else f", from the {first} row on (the rows before it not run)"
    pipelines = sum(r["row"] == "+ pipeline" for r in res.rows(rel))
    caption += "" if pipelines < 2 else "; each pipeline row against the chunk-end row"
    caption += ".*"
    header = ["row", "what changes", "ms / env step", "over previous", "cumulative", "BEHAVIOR published"]
    return Block([caption, "", *table(header, rows, "llrrrr")], [rel])


def step_cost(rel: str, res: Results) -> Block:
    """A HalfCheetah step bare and with each observation normaliser: the median over rounds, against bare."""
    data = res.json(rel)
    median, args = data["median_us"], data["args"]
    rounds = {v: [fixed(r["us_per_step"], 1) for r in data["rows"] if r["variant"] == v] for v in median}
    rows = [[v, fixed(us, 1), times(us / median["bare"]), ", ".join(rounds[v])] for v, us in median.items()]
    caption = (
        f"*HalfCheetah-v5, {args['steps']:,} steps a round, {args['rounds']} rounds alternating the order, one process;"
        " µs a step, the median over the rounds; gymnasium: `NormalizeObservation` and a clip wrapper, m2flow:"
        " `ClippedNormalization` (bit-identical statistics and observations)*"
    )
    return Block([caption, "", *table(["normaliser", "µs a step", "vs bare", "rounds"], rows, "lrrl")], [rel])


def physics_scaling(rel: str, res: Results) -> Block:
    """HalfCheetah steps in P processes at once, a core each: the processes' median µs a step, against one alone."""
    rows_in = res.rows(rel)
    alone = rows_in[0]["median_us"]
    rows = [
        [str(r["processes"]), fixed(r["median_us"], 1), fixed(max(r["us_per_step"]), 1), times(r["median_us"] / alone)]
        for r in rows_in
    ]
    steps = res.json(rel)["args"]["steps"]
    caption = f"*HalfCheetah-v5 (bare, no normaliser), {steps:,} steps in each process, all processes at once*"
    header = ["processes", "µs a step, median", "µs a step, slowest", f"vs {rows_in[0]['processes']} alone"]
    return Block([caption, "", *table(header, rows, "rrrr")], [rel])
