"""Render every table, and the figures quoted in prose, of benchmarks/RESULTS.md from benchmarks/results/.

RESULTS.md holds marker pairs. `<!-- table: NAME -->` ... `<!-- /table -->` is replaced by TABLES[NAME]'s
table and one `raw:` line per file it read (from that file's `meta` block); `<!-- fig: NAME -->` ...
`<!-- /fig -->` inside prose is replaced by FIGURES[NAME]. Nothing else in the file is touched.

    python benchmarks/render_results.py            # rewrite RESULTS.md in place
    python benchmarks/render_results.py --check    # exit 1 and name each block that differs
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = re.compile(r"(?P<open><!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)", re.S)
FIG = re.compile(r"(?P<open><!-- fig: (?P<name>[\w.-]+) -->)(?P<body>.*?)(?P<close><!-- /fig -->)")


class RenderError(Exception):
    """RESULTS.md or a results file is not what rendering needs (unknown marker, missing file or meta)."""


class Results:
    """The raw outputs under one results folder, each file read once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, object] = {}

    def _read(self, rel: str, parse: Callable[[str], object]) -> object:
        if rel not in self._cache:
            path = self.folder / rel
            if not path.is_file():
                raise RenderError(f"{path}: no such results file; re-run its benchmark or fix the name here")
            self._cache[rel] = parse(path.read_text())
        return self._cache[rel]

    def json(self, rel: str) -> dict:
        return self._read(rel, json.loads)

    def jsonl(self, rel: str) -> list[dict]:
        return self._read(rel, lambda text: [json.loads(line) for line in text.splitlines() if line.strip()])

    def text(self, rel: str) -> str:
        return self._read(rel, str)

    def rows(self, rel: str) -> list[dict]:
        return self.json(rel)["rows"]

    def raw_line(self, rel: str) -> str:
        """`raw: <file>, commit <c>, <date>, <machine>`; a .jsonl keeps its meta in `<stem>.meta.json` beside it."""
        meta_file = rel.removesuffix(".jsonl") + ".meta.json" if rel.endswith(".jsonl") else rel
        meta = self.json(meta_file).get("meta")
        if meta is None:
            raise RenderError(f"{self.folder / meta_file}: no `meta` block; write it with results_io.save_result")
        line = f"raw: benchmarks/results/{rel}, commit {meta['commit']}, {meta['date']}, {meta['machine']}"
        return line + (f" ({meta['meta_source']})" if "meta_source" in meta else "")


@dataclass
class Block:
    """A rendered table: its lines (caption included) and the results files it was read from."""

    lines: list[str]
    sources: list[str]


def fixed(x: float, digits: int = 3) -> str:
    return f"{x:,.{digits}f}"


def times(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}x"


def pct(x: float) -> str:
    return f"{x:+.1%}"


def count(x: float) -> str:
    return f"{x:,.0f}"


def span(values: list[float], fmt: Callable[[float], str]) -> str:
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low} .. {high}"


def table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """A markdown table; `align` has one letter per column, l or r."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(cells) + " |" for cells in [header, rule, *rows]]


# --- engine_overhead.py -----------------------------------------------------------------------------------------

ENGINE = "engine_overhead.json"


def engine_overhead(res: Results) -> Block:
    rows = [
        [r["case"], count(r["hand_steps_per_s"]), count(r["m2flow_steps_per_s"]), times(r["ratio"])]
        + [count(r["m2flow_colocated_steps_per_s"]), times(r["colocated_ratio"])]
        + ([count(r["m2flow_hybrid_s2_steps_per_s"]), times(r["hybrid_ratio"])] if "hybrid_ratio" in r else ["—"] * 2)
        for r in res.rows(ENGINE)
    ]
    header = ["case", "hand-written env steps/s", "(b) two processes", "ratio", "(c) colocated", "ratio"]
    return Block(table([*header, "(d) hybrid S=2", "ratio"], rows, "lrrrrrrr"), [ENGINE])


def hop_ms(res: Results) -> float:
    """What two processes on one core add to a MuJoCo loop step: the round trip between them."""
    return step_ms("MuJoCo", "m2flow_steps_per_s", res) - step_ms("MuJoCo", "hand_steps_per_s", res)


def step_ms(prefix: str, key: str, res: Results) -> float:
    """Milliseconds per loop step (each of the case's envs stepped once) at the rate under `key`."""
    case = next(r for r in res.rows(ENGINE) if r["case"].startswith(prefix))
    return int(re.search(r"(\d+) envs?\)", case["case"])[1]) / case[key] * 1e3


# --- modes.py ---------------------------------------------------------------------------------------------------

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


# --- planner.py, faults.py, simulator_ablation.py ---------------------------------------------------------------

PLANNER, FAULTS = "planner_scale.json", "faults.json"


def planner_scale(res: Results) -> Block:
    rows = [
        [str(r["workers"]), count(r["gpus"]), str(r["nodes"]), f"{r['plan_s']:.2f} s", r["chosen"]]
        + [str(r["candidates"]), count(r["tasks"])]
        for r in res.rows(PLANNER)
    ]
    header = ["workers", "GPUs", "nodes", "plan time", "chosen", "candidates", "tasks simulated"]
    return Block(table(header, rows, "rrrrlrr"), [PLANNER])


def plan_growth(workers: int, res: Results, small: int = 256, large: int = 1024) -> str:
    plan_s = {r["gpus"]: r["plan_s"] for r in res.rows(PLANNER) if r["workers"] == workers}
    return times(plan_s[large] / plan_s[small], 1)


def faults(res: Results) -> Block:
    yes = {True: "yes", False: "no"}
    rows = [
        [str(i), r["victim"], f"{r['detection_s']:.3f} s", str(r["failures"])]
        + [yes[r["completed"]], yes[r["iterations"]], str(r["checkpoints_lost"])]
        for i, r in enumerate(res.rows(FAULTS))
    ]
    header = ["run", "killed", "detected after", "failures seen", "completed", "every iteration once"]
    return Block(table([*header, "checkpoints lost"], rows, "rlrrllr"), [FAULTS])


ABLATION_CHANGES = {  # row -> what it changes over the previous one
    "baseline": "full rendering; every camera x RGB, depth, segmentation; observations every step",
    "slim": "fast rendering; only the RGB images the policy reads",
    "+ chunk end": "observations only at the end of each {chunk}-action chunk",
    "+ pipeline": "S=2, simulator and inference on separate cores (hybrid)",
}


def ablation(rel: str, res: Results) -> Block:
    args = res.json(rel)["args"]
    rows = [
        [
            r["row"],
            ABLATION_CHANGES[r["row"]].format(**args),
            fixed(r["ms_per_step"]),
            times(r["speedup"]) if i else "—",
        ]
        + [times(r["cumulative"], 1), times(r["published"], 1) if r["published"] else "—"]
        for i, r in enumerate(res.rows(rel))
    ]
    caption = f"*task {args['task']}, {args['envs']} envs, {args['chunks']} chunks of {args['chunk']} actions an"
    caption += f" iteration, {args['size']}x{args['size']} images; rows are cumulative.*"
    header = ["row", "what changes", "ms / env step", "over previous", "cumulative", "BEHAVIOR published"]
    return Block([caption, "", *table(header, rows, "llrrrr")], [rel])


def port_cell(rel: str, port: str, column: int, res: Results) -> str:
    """One cell (0 predicted, 1 measured, 2 ratio) of a per-port table as the CLI prints it."""
    match = re.search(rf"│ {re.escape(port)} +│(.*)│\s*$", res.text(rel), re.M)
    if match is None:
        raise RenderError(f"{res.folder / rel}: no row {port!r} in its per-port table")
    return match[1].split("│")[column].strip()


# --- PPO runs (metrics.jsonl) -----------------------------------------------------------------------------------

METAWORLD = "ppo_metaworld_camera_metrics.jsonl"
PPO_H200, VIT, CHECK = "gpu/ppo_camera_metrics.jsonl", "gpu6/vit_metrics.jsonl", "gpu7/ppo_camera_check_metrics.jsonl"


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


# --- channels.py, backends.py, multigpu.py ----------------------------------------------------------------------

CHANNELS = ["channels.json", "gpu4/channels.json"]


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


def channel_ms(cost: Callable[[dict], float], res: Results) -> str:
    return span([cost(r) for rel in CHANNELS for r in res.rows(rel)], lambda ms: f"{ms:.2f} ms")


BACKEND_OPTIONS = {"-": "—", "activation_checkpointing": "activation checkpointing", "cpu_offload": "CPU offload"}
BACKENDS = ["gpu5/backends.json", "gpu9/backends.json", "gpu10/backends.json"]
OFFLOAD = "gpu5/backends_offload.json"


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


MULTIGPU = "gpu8/multigpu.json"


def multigpu(res: Results) -> Block:
    rows = [
        [r["backend"], str(r["ranks"]), ", ".join(r["devices"]), f"{r['update_s']:.3f}", count(r["samples_per_s"])]
        + [times(r["speedup_vs_1"]), f"{r['max_abs_diff_vs_1']:.1e}" if r["ranks"] > 1 else "—"]
        for r in res.rows(MULTIGPU)
    ]
    header = ["backend", "ranks", "GPUs", "s / update", "samples/s", "vs 1 rank", "max abs weight difference vs 1 rank"]
    return Block(table(header, rows, "lrlrrrr"), [MULTIGPU])


# --- registries -------------------------------------------------------------------------------------------------

SPIN, BEFORE_HOPS, CAMERA_CPU = "modes_spin.json", "modes.json", "modes_camera.json"
H200, H200_PROFILED, H200_HOPS, X2 = (f"{d}/modes_camera.json" for d in ("gpu", "gpu2", "gpu3", "gpu8"))
FSDP_100, MEGATRON_100 = ("fsdp", "100m", "bf16"), ("megatron", "100m", "bf16")
CKPT = "activation_checkpointing"

TABLES: dict[str, Callable[[Results], Block]] = {
    "engine_overhead": engine_overhead,
    "modes_spin": partial(modes_table, SPIN),
    "modes_spin_before_hops": partial(modes_table, BEFORE_HOPS),
    "modes_camera_cpu": partial(modes_table, CAMERA_CPU),
    "planner_scale": planner_scale,
    "faults": faults,
    "ablation_metaworld": partial(ablation, "simulator_ablation_metaworld.json"),
    "ablation_cheetah_h200": partial(ablation, "gpu/simulator_ablation_cheetah.json"),
    "modes_camera_h200": partial(modes_table, H200),
    "modes_camera_h200_profiled": partial(modes_table, H200_PROFILED),
    "modes_camera_h200_hops": partial(modes_table, H200_HOPS),
    "ppo_camera_h200": ppo_camera_h200,
    "ppo_metaworld": ppo_metaworld,
    "channels": channels,
    "backends": backends,
    "backends_10m_reruns": backends_10m,
    "multigpu": multigpu,
    "modes_camera_x2": partial(modes_table, X2),
}

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


# --- rendering --------------------------------------------------------------------------------------------------


def render_table(name: str, res: Results) -> str:
    if name not in TABLES:
        raise RenderError(f"RESULTS.md names table {name!r}, which TABLES does not have; known: {', '.join(TABLES)}")
    block = TABLES[name](res)
    return "\n".join(block.lines) + "\n\n" + "\n\n".join(res.raw_line(rel) for rel in block.sources) + "\n"


def render_figure(name: str, res: Results) -> str:
    if name not in FIGURES:
        raise RenderError(f"RESULTS.md names figure {name!r}, which FIGURES does not have; add it there")
    return FIGURES[name](res)


def render(doc: str, res: Results) -> tuple[str, list[str]]:
    """The document with every marked block rendered, and the names of the blocks whose text changed."""
    changed: list[str] = []

    def substitute(kind: str, draw: Callable[[str, Results], str]) -> Callable[[re.Match], str]:
        def replace(match: re.Match) -> str:
            body = draw(match["name"], res)
            if body != match["body"]:
                changed.append(f"{kind} {match['name']}")
            return match["open"] + body + match["close"]

        return replace

    doc = TABLE.sub(substitute("table", render_table), doc)
    return FIG.sub(substitute("figure", render_figure), doc), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if RESULTS.md is out of date")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="folder of raw outputs")
    parser.add_argument("--doc", type=Path, default=HERE / "RESULTS.md", help="the document to render")
    args = parser.parse_args(argv)
    try:
        doc = args.doc.read_text()
        rendered, changed = render(doc, Results(args.results))
    except RenderError as exc:
        print(f"render_results: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for name in changed:
            print(f"{args.doc}: {name} differs from what {args.results} renders to")
        if changed:
            print("run `python benchmarks/render_results.py` to re-render it")
        return 1 if changed else 0
    if rendered != doc:
        args.doc.write_text(rendered)
    print(f"{args.doc}: {len(changed)} block(s) re-rendered" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
