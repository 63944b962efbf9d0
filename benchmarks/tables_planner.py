"""The planner's tables of benchmarks/RESULTS.md: planner.py's planning times, planner_accuracy.py's predictions
against measured iterations, cost_cache.py's repeated runs predicted from the cache kept two ways, and merging.py's
merged slices against slice-by-slice calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from results_io import Results
from tables_format import Block, count, fixed, pct, span, table, times

PLANNER = "planner_scale.json"
HAND_LAYOUTS = "planner_hand_layouts.json"
ACCURACY, ACCURACY_H200 = "planner_accuracy.json", "gpu11/planner_accuracy.json"
ACCURACY_H200_PROCESSOR_SHARING = "gpu22/planner_accuracy.json"  # the same sweep after the fit's processor sharing
ACCURACY_H200_BY_SIZE = "gpu23/planner_accuracy_by_size.json"  # after the cache kept every batch size
ACCURACY_H200_TRIAL = "gpu23/planner_accuracy.json"  # after trials, calibrating 9 iterations


def planner_scale(res: Results) -> Block:
    rows = [
        [str(r["workers"]), count(r["gpus"]), str(r["nodes"]), f"{r['plan_s']:.2f} s", r["chosen"]]
        + [str(r["candidates"]), count(r["tasks"]), "chosen" if r["allocation"] else "given"]
        for r in res.rows(PLANNER)
    ]
    header = ["workers", "GPUs", "nodes", "plan time", "chosen", "candidates", "tasks", "replica counts"]
    return Block(table(header, rows, "rrrrlrrl"), [PLANNER])


def planner_hand_layouts(res: Results) -> Block:
    rows = res.rows(HAND_LAYOUTS)
    auto_s = rows[0]["iteration_s"]
    body = [
        [
            r["layout"],
            r["plan"],
            fixed(r["iteration_s"], 4),
            count(r["env_steps_per_s"]),
            times(r["iteration_s"] / auto_s),
        ]
        for r in rows
    ]
    header = ["layout", "plan", "predicted s/iteration", "env steps/s", "vs auto"]
    return Block(table(header, body, "llrrr"), [HAND_LAYOUTS])


def planner_accuracy(rel: str, res: Results) -> Block:
    data = res.json(rel)
    by_round = any(len(r.get("rounds_predicted_s", [])) > 1 for w in data["workloads"] for r in w["rows"])
    rows = []
    for w in data["workloads"]:
        if "failed" in w.get("calibration", {}):  # its calibrating run failed: no candidate ran
            rows.append([w["workload"], "calibrating run (auto)", "", "failed", "", ""] + [""] * by_round)
        rows += [
            [
                w["workload"],
                f"{r['mode']} S={r['stages']}"
                + (" co-hosted" if r.get("co_hosted") else "")
                + (f" ({r['variant']})" if r.get("variant") else ""),
                _with_rounds(r["predicted_s"], r.get("rounds_predicted_s", [])),
                _with_rounds(r["measured_s"], r.get("rounds_s", [])) if "measured_s" in r else "failed",
                pct(r["error"]) if "measured_s" in r else "",
            ]
            + ([_round_errors(r)] if by_round else [])
            + [", ".join(mark for mark, on in (("auto", r.get("auto")), ("relaid", r.get("relaid"))) if on)]
            for r in w["rows"]
            if "measured_s" in r or "failed" in r
        ]
    rounds = data["args"].get("rounds", 1)
    caption = (
        "*no costs declared: each workload calibrated by a run of its own (measure, re-plan, cache), then every"
        f" candidate run for {data['args']['iterations']} iterations, median after the first"
        + (
            f"; {rounds} rounds in alternating order, their median measured (each round's in brackets)"
            if rounds > 1
            else ""
        )
        + (
            "; each run planned as it started, from the cache the runs before it left: a candidate's prediction is"
            " its first round's (each round's in brackets, each round's own error beside), `relaid`: a later round"
            " planned another process layout"
            if by_round
            else ""
        )
        + (
            "; beside the modes and stage counts, each other replica count auto's allocation weighs (at auto's mode"
            " and stages for it) and an RLinf-style layout by hand (`by hand`, `placement.devices`)"
            if any(r.get("variant") for w in data["workloads"] for r in w["rows"])
            else ""
        )
        + f"; `{data['summary']}`*"
    )
    header = ["workload", "plan", "predicted s", "measured s", "error"]
    header += ["error by round"] * by_round + ["chosen"]
    return Block([caption, "", *table(header, rows, "llrrr" + "r" * by_round + "l")], [rel])


def planner_accuracy_by_stages(files: list[str], res: Results) -> Block:
    """Sweeps of one workload side by side: each plan's error at one stage and at more (a bias the sweeps share shows
    as one sign per column), the measured-fastest plan and auto's choice against it."""
    rows = []
    for rel in files:
        data = res.json(rel)
        for w in data["workloads"]:
            measured = [r for r in w["rows"] if "measured_s" in r]
            fastest = min(measured, key=lambda r: r["measured_s"])
            chosen = next(r for r in measured if r.get("auto"))
            one = ", ".join(f"{r['mode']} {pct(r['error'])}" for r in measured if r["stages"] == 1)
            more = [r["error"] for r in measured if r["stages"] > 1]
            rows.append(
                [rel.split("/")[0], data["meta"]["commit"], one, span(more, pct)]
                + [f"{fastest['mode']} S={fastest['stages']}", f"{chosen['mode']} S={chosen['stages']}"]
                + [pct(chosen["measured_s"] / fastest["measured_s"] - 1)]
            )
    header = ["sweep", "commit", "error at S=1", "error at S>1", "fastest", "auto", "auto vs fastest"]
    return Block(table(header, rows, "llllllr"), files)


def replay_calibration(rel: str, res: Results) -> Block:
    """A sweep replayed (`replay_calibration.py`): each candidate's prediction refit at this commit from the sweep's
    calibrating trace, the sweep's own prediction and measured time beside it, and auto's choice."""
    data = res.json(rel)
    rows = [
        [
            f"{r['mode']} S={r['stages']}",
            fixed(r["sweep_predicted_s"]),
            fixed(r["predicted_s"]),
            fixed(r["measured_s"]),
            pct(r["error"]),
            "auto" if r["auto"] else "",
        ]
        for r in data["rows"]
    ]
    trial = data.get("trial")
    after = (
        f" and its {trial} run's after it, as a trial (that plan's own prediction fitted to itself)" if trial else ""
    )
    caption = (
        f"*{data['workload']} sweep of {data['sweep']} (code {data['sweep_commit']}) replayed at"
        f" {data['meta']['commit']}: its calibrating run's trace refit{after}, every candidate planned again on it;"
        f" measured: the sweep's; `{data['summary']}`*"
    )
    header = ["plan", "predicted in the sweep s", "predicted now s", "measured s", "error now", "chosen now"]
    return Block([caption, "", *table(header, rows, "lrrrrl")], [rel])


def _with_rounds(seconds: float, rounds: list[float]) -> str:
    """A candidate's seconds, each round's beside them where there were several."""
    return fixed(seconds) + (f" ({', '.join(fixed(s) for s in rounds)})" if len(rounds) > 1 else "")


def _round_errors(row: dict) -> str:
    """Each round's measured time against that round's own prediction (a round that failed has none)."""
    pairs = zip(row.get("rounds_predicted_s", []), row.get("rounds_s", []), strict=False)
    return ", ".join(pct(measured / predicted - 1) for predicted, measured in pairs)


@dataclass(frozen=True)
class HopUnit:
    """What a hop_by_plan file calibrated: its rows' key and how the table heads and explains it."""

    key: str
    header: str
    what: str


WHOLE_MESSAGE = HopUnit("hop_ms", "hop ms", "the cost of a loop message between processes")
PER_ITEM = HopUnit(
    "hop_item_us",
    "hop us per item",
    "the cost of each item a loop message between processes carries (beside 0.1 ms a message)",
)


def hop_by_plan(rel: str, unit: HopUnit, res: Results) -> Block:
    """Per workload and plan: the message hop its own run calibrated, against the calibrating run's."""
    data = res.json(rel)
    rows = []
    for w in data["workloads"]:
        first = w["rows"][0][unit.key]
        rows += [
            [
                w["workload"],
                r["plan"] + (" (calibrating run)" if r["role"] == "calibrating run" else ""),
                "failed" if "failed" in r else "none" if r[unit.key] is None else fixed(r[unit.key]),
                times(r[unit.key] / first) if r[unit.key] is not None and first else "",
                fixed(r["measured_s"]) if "measured_s" in r else "",
            ]
            for r in w["rows"]
        ]
    caption = (
        f"*each workload's calibrating run ({data['args']['calibration_iterations']} iterations, auto), then each"
        f" plan run for {data['args']['iterations']} iterations from the port costs it cached, without its hop; hop:"
        f" {unit.what}, the one that makes the loop predicted from the run's own port costs take what it measured;"
        f" `{data['summary']}`*"
    )
    header = ["workload", "plan", unit.header, "vs calibrating run's", "measured s"]
    return Block([caption, "", *table(header, rows, "llrrr")], [rel])


def make_run_table(rel: str, res: Results) -> Block:
    """`make run`'s end-of-run table, run after run from an empty cost cache: the iteration and each phase,
    predicted beside measured, and the ports off their prediction by more than the table flags."""
    data = res.json(rel)
    phases = ("sync", "loop", "then")
    rows = [
        [
            str(r["run"]),
            r["plan"],
            fixed(r["predicted_s"]),
            fixed(r["measured_s"]),
            fixed(r["median_s"]),
            pct(r["error"]),
            *(_versus(r["phase_s"].get(p)) for p in phases),
            ", ".join(r["ports_off"]) or "none",
        ]
        for r in data["runs"]
    ]
    caption = (
        f"*`make run` ({', '.join(data['args']['overrides']) or 'as configured'}) {len(rows)} times in a row from an"
        " empty cost cache; each row its end-of-run table (`report.json`): seconds per iteration, the measured"
        " iterations' mean (and median) beside the plan's prediction, each phase predicted / measured;"
        f" `{data['summary']}`*"
    )
    header = ["run", "plan", "predicted s", "measured s", "median s", "error", *(f"{p} s" for p in phases)]
    return Block([caption, "", *table([*header, "ports off >25%"], rows, "llrrrrrrrl")], [rel])


def _versus(compared: dict | None) -> str:
    """`predicted / measured`, or nothing where the run did not have the quantity."""
    return f"{fixed(compared['predicted'])} / {fixed(compared['measured'])}" if compared else ""


def cost_cache(rel: str, res: Results) -> Block:
    data = res.json(rel)
    policies = ("median", "last run")
    rows = [
        [w["workload"], str(r["run"]) + (" (disturbed)" if r.get("disturbed") else ""), fixed(r["measured_s"])]
        + [cell for p in policies for cell in (fixed(r[p]["predicted_s"]), pct(r[p]["error"]))]
        for w in data["workloads"]
        for r in w["rows"]
    ]
    plans = ", ".join(sorted({f"{w['workload']} {w['plan']}" for w in data["workloads"]}))
    caption = (
        f"*{plans}: each run {data['args']['iterations']} iterations (median after the first), predicted from a cache"
        " of the runs before it kept two ways: at each batch size the median of the last runs (`RUNS_KEPT`), or the"
        f" last run alone; `{data['summary']}`*"
    )
    header = ["workload", "run", "measured s", "median: predicted s", "error", "last run: predicted s", "error"]
    return Block([caption, "", *table(header, rows, "llrrrrr")], [rel])


def merging(res: Results) -> Block:
    rel = "merging.json"
    data = res.json(rel)
    rows = [
        [
            str(r["round"]),
            "merged" if r["merge"] else "per slice",
            fixed(r["predicted_loop_s"]),
            fixed(r["loop_s"]),
            pct(r["loop_s"] / r["predicted_loop_s"] - 1),
            fixed(r["iteration_s"]),
            ", ".join(f"{calls} of {rows} rows" for rows, calls in r["act_calls_by_rows"].items()),
        ]
        for r in data["runs"]
    ]
    header = [
        "round",
        "policy calls",
        "predicted loop s",
        "measured loop s",
        "error",
        "iteration s",
        "traced act calls",
    ]
    caption = (
        f"*a spin simulator and a policy paid mostly per call, hybrid S=4, {data['args']['iterations']} iterations a"
        f" run (median after the first), rounds alternating; `{data['line']}`*"
    )
    return Block([caption, "", *table(header, rows, "llrrrrl")], [rel])


def threads(rel: str, res: Results) -> Block:
    data = res.json(rel)
    rows = [
        [
            r["workload"],
            str(r["round"]),
            str(r["threads"]),
            fixed(r["iteration_s"]),
            fixed(r["then_s"]),
            fixed(r["loop_s"]),
        ]
        for r in data["runs"]
    ]
    by_round: dict[tuple[str, int], dict[int, float]] = {}
    for r in data["runs"]:
        by_round.setdefault((r["workload"], r["round"]), {})[r["threads"]] = r["iteration_s"]
    ratios = "; ".join(
        f"{workload}: per iteration {times(s['iteration_ratio'])} (rounds: "
        + ", ".join(times(t[1] / t[2]) for (w, _), t in by_round.items() if w == workload)
        + f"), training {times(s['training_ratio'])}"
        for workload, s in data["summary"].items()
    )
    caption = (
        f"*the actor on 1 and on 2 cores (`resources.threads`), shared S=1, {data['args']['iterations']} iterations a"
        f" run (medians after the first), rounds alternating the order; 2 cores over 1, medians over the rounds:"
        f" {ratios}; `{data['line']}`*"
    )
    header = ["workload", "round", "actor cores", "iteration s", "training s", "loop s"]
    return Block([caption, "", *table(header, rows, "llrrrr")], [rel])


# the camera-ViT sweeps of planner_accuracy.py on the lent H100s since a message's cost per item (gpu40 on)
GPU_ACCURACY_SWEEPS = [
    "gpu40/planner_accuracy.json",
    "gpu40/planner_accuracy_repeat.json",
    "gpu41/planner_accuracy.json",
    "gpu41/planner_accuracy_repeat.json",
    "gpu41/planner_accuracy_third.json",
    "gpu43/planner_accuracy.json",
    "gpu44/planner_accuracy.json",
    "gpu45/planner_accuracy.json",
    "gpu46/planner_accuracy.json",
    "gpu47/planner_accuracy.json",
    "gpu50/planner_accuracy.json",
    "gpu52/planner_accuracy.json",
]
# the camera-CNN sweeps (`camera-cnn-gpu`) on the lent H100s
GPU_CNN_ACCURACY_SWEEPS = [f"gpu{n}/planner_accuracy.json" for n in (48, 49, 51, 53)]

# the planner's tables in RESULTS.md (`results_tables.TABLES` holds them with the others)
PLANNER_TABLES: dict[str, Callable[[Results], Block]] = {
    "planner_scale": planner_scale,
    "planner_hand_layouts": planner_hand_layouts,
    "planner_accuracy": partial(planner_accuracy, ACCURACY),
    "planner_accuracy_wall_time": partial(planner_accuracy, "planner_accuracy_wall_time.json"),
    "planner_accuracy_last_fit": partial(planner_accuracy, "planner_accuracy_last_fit.json"),
    "planner_accuracy_by_size": partial(planner_accuracy, "planner_accuracy_by_size.json"),
    "planner_accuracy_cpu_spin": partial(planner_accuracy, "planner_accuracy_cpu_spin.json"),
    "planner_accuracy_cpu_dec05": partial(planner_accuracy, "planner_accuracy_cpu_dec05.json"),
    "planner_accuracy_cpu_dec05b": partial(planner_accuracy, "planner_accuracy_cpu_dec05b.json"),
    "planner_accuracy_cpu_dec05c": partial(planner_accuracy, "planner_accuracy_cpu_dec05c.json"),
    "planner_accuracy_cpu_colocate": partial(planner_accuracy, "planner_accuracy_cpu_colocate.json"),
    "planner_accuracy_cpu_dec05d": partial(planner_accuracy, "planner_accuracy_cpu_dec05d.json"),
    "planner_accuracy_cpu_colocate_dec05": partial(planner_accuracy, "planner_accuracy_cpu_colocate_dec05.json"),
    "planner_accuracy_cpu_dec06": partial(planner_accuracy, "planner_accuracy_cpu_dec06.json"),
    "planner_accuracy_cpu_dec06b": partial(planner_accuracy, "planner_accuracy_cpu_dec06b.json"),
    "planner_accuracy_cpu_dec06c": partial(planner_accuracy, "planner_accuracy_cpu_dec06c.json"),
    "planner_accuracy_cpu_dec06d": partial(planner_accuracy, "planner_accuracy_cpu_dec06d.json"),
    "planner_accuracy_cpu_dec06e": partial(planner_accuracy, "planner_accuracy_cpu_dec06e.json"),
    "planner_accuracy_cpu_dec06f": partial(planner_accuracy, "planner_accuracy_cpu_dec06f.json"),
    "planner_accuracy_cpu_dec06g": partial(planner_accuracy, "planner_accuracy_cpu_dec06g.json"),
    "planner_accuracy_cpu_dec07": partial(planner_accuracy, "planner_accuracy_cpu_dec07.json"),
    "planner_accuracy_cpu_dec07b_main": partial(planner_accuracy, "planner_accuracy_cpu_dec07b_main.json"),
    "planner_accuracy_cpu_dec07c": partial(planner_accuracy, "planner_accuracy_cpu_dec07c.json"),
    "planner_accuracy_cpu_dec07d": partial(planner_accuracy, "planner_accuracy_cpu_dec07d.json"),
    "planner_accuracy_cpu_dec08": partial(planner_accuracy, "planner_accuracy_cpu_dec08.json"),
    "hop_by_plan_whole": partial(hop_by_plan, "hop_by_plan_whole.json", WHOLE_MESSAGE),
    "hop_by_plan": partial(hop_by_plan, "hop_by_plan.json", PER_ITEM),
    "planner_accuracy_cpu_dec06c_main": partial(planner_accuracy, "planner_accuracy_cpu_dec06c_main.json"),
    "planner_accuracy_h200": partial(planner_accuracy, ACCURACY_H200),
    "planner_accuracy_h200_processor_sharing": partial(planner_accuracy, ACCURACY_H200_PROCESSOR_SHARING),
    "planner_accuracy_h200_by_size": partial(planner_accuracy, ACCURACY_H200_BY_SIZE),
    "planner_accuracy_h200_trial": partial(planner_accuracy, ACCURACY_H200_TRIAL),
    "planner_accuracy_h200_dec05": partial(planner_accuracy, "gpu26/planner_accuracy.json"),
    "planner_accuracy_h100_dec06": partial(planner_accuracy, "gpu28/planner_accuracy.json"),
    "planner_accuracy_h100_dec06b": partial(planner_accuracy, "gpu31/planner_accuracy.json"),
    "planner_accuracy_h100_dec06b_repeat": partial(planner_accuracy, "gpu31/planner_accuracy_repeat.json"),
    "planner_accuracy_h100_dec06c": partial(planner_accuracy, "gpu40/planner_accuracy.json"),
    "planner_accuracy_h100_dec06c_repeat": partial(planner_accuracy, "gpu40/planner_accuracy_repeat.json"),
    "planner_accuracy_h100_dec06d": partial(planner_accuracy, "gpu41/planner_accuracy.json"),
    "planner_accuracy_h100_dec06d_repeat": partial(planner_accuracy, "gpu41/planner_accuracy_repeat.json"),
    "planner_accuracy_h100_dec06d_third": partial(planner_accuracy, "gpu41/planner_accuracy_third.json"),
    "planner_accuracy_h100_dec07": partial(planner_accuracy, "gpu43/planner_accuracy.json"),
    "planner_accuracy_h100_by_stages": partial(planner_accuracy_by_stages, GPU_ACCURACY_SWEEPS),
    "planner_accuracy_h100_dec07b": partial(planner_accuracy, "gpu44/planner_accuracy.json"),
    "planner_accuracy_h100_dec07c": partial(planner_accuracy, "gpu45/planner_accuracy.json"),
    "planner_accuracy_h100_dec07d": partial(planner_accuracy, "gpu46/planner_accuracy.json"),
    "planner_accuracy_h100_dec07e": partial(planner_accuracy, "gpu47/planner_accuracy.json"),
    **{
        f"replay_calibration_{sweep}": partial(replay_calibration, f"{sweep}/replay_calibration.json")
        for sweep in ("gpu44", "gpu45", "gpu46", "gpu47", "gpu48")
    },
    "planner_accuracy_h100_cnn_dec07": partial(planner_accuracy, "gpu48/planner_accuracy.json"),
    "planner_accuracy_h100_cnn_dec07b": partial(planner_accuracy, "gpu49/planner_accuracy.json"),
    "planner_accuracy_h100_vit_dec07f": partial(planner_accuracy, "gpu50/planner_accuracy.json"),
    "planner_accuracy_h100_cnn_dec07c": partial(planner_accuracy, "gpu51/planner_accuracy.json"),
    "planner_accuracy_h100_vit_dec07g": partial(planner_accuracy, "gpu52/planner_accuracy.json"),
    "planner_accuracy_h100_cnn_dec07d": partial(planner_accuracy, "gpu53/planner_accuracy.json"),
    "planner_accuracy_h100_cnn_dec07e": partial(planner_accuracy, "gpu54/planner_accuracy_a.json"),
    "planner_accuracy_h100_cnn_dec07f": partial(planner_accuracy, "gpu54/planner_accuracy_b.json"),
    "planner_accuracy_h100_cnn_dec07g": partial(planner_accuracy, "gpu54/planner_accuracy_c.json"),
    "planner_accuracy_h100_cnn_by_stages": partial(planner_accuracy_by_stages, GPU_CNN_ACCURACY_SWEEPS),
    **{
        f"replay_calibration_trial_{sweep}": partial(
            replay_calibration, f"{sweep}/replay_calibration_trial_shared-S1-round1.json"
        )
        for sweep in ("gpu44", "gpu45", "gpu46", "gpu47", "gpu48")
    },
}
