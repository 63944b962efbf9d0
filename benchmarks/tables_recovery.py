"""The recovery tables of benchmarks/RESULTS.md: faults.py's kills, chaos.py's long runs with faults, hosts.py's
two-host job, and replacement.py's replacements with spare processes and without."""

from __future__ import annotations

from results_io import Results, share_down
from tables_format import Block, count, table

FAULTS, CHAOS, CHAOS_SEED3, HOSTS = "faults.json", "chaos.json", "chaos_seed3.json", "hosts.json"
CHAOS_SPARES = "chaos_spares.json"  # the rounds with spare processes (run.spares): seed 0...
CHAOS_SEED3_SPARES = "chaos_seed3_spares.json"  # ...and seed 3
CHAOS_SEED3_FINAL, CHAOS_FINAL = "chaos_seed3_final.json", "chaos_final.json"  # processes beating: seeds 3 and 0
CHAOS_SEED1 = "chaos_seed1.json"  # a new draw, with what the beats' round left open fixed
SPARES = "replacement_spares.json"


def faults(res: Results) -> Block:
    yes = {True: "yes", False: "no"}
    rows = [
        [str(i), r["victim"], f"{r['detection_s']:.3f} s", str(r["failures"])]
        + [yes[r["completed"]], yes[r["iterations"]], str(r["checkpoints_lost"])]
        for i, r in enumerate(res.rows(FAULTS))
    ]
    header = ["run", "killed", "detected after", "failures seen", "completed", "every iteration once"]
    return Block(table([*header, "checkpoints lost"], rows, "rlrrllr"), [FAULTS])


def chaos_faults(name: str, res: Results) -> Block:
    data = res.json(name)
    start = min((f["at"] for f in data["faults"]), default=0.0)
    rows = [
        [f"{f['at'] - start:.0f} s", f["kind"], f["victim"]]
        + ["—" if f["detected_s"] is None else f"{f['detected_s']:.2f} s", f["recovered"] or "—"]
        for f in data["faults"]
    ]
    header = ["injected at", "fault", "process", "detected after", "recovered"]
    return Block(table(header, rows, "rlllr"), [name])


def seconds_pair(summary: dict, first: str, second: str) -> str:
    """Two durations of a summary as "a s / b s", or a dash where the run did not record them."""
    if first not in summary:
        return "—"
    return f"{summary[first]:.3f} s / {summary[second]:.3f} s"


def fault_free_wall(summary: dict) -> str:
    """The fault-free wall time: the mean of the runs before and after the one with faults, where both ran."""
    if "fault_free_runs_s" not in summary:
        return f"{summary['fault_free_s']:.0f} s"
    before, after = summary["fault_free_runs_s"]
    return f"{summary['fault_free_s']:.0f} s (mean of {before:.0f} s before, {after:.0f} s after)"


def chaos_summary(name: str, res: Results) -> Block:
    s = res.json(name)["summary"]
    rows = [
        ["iterations, a fault every", f"{s['iterations']}, {s['fault_every_s']:.0f} s"],
        [
            "faults injected (failures + slow replicas)",
            f"{s['faults']} ({s['failures_injected']} + {s['faults'] - s['failures_injected']})",
        ],
        [
            "failures detected, within the plan's longest deadline",
            f"{s['detected']}, {s['detected_within_deadline']} (≤ {s['deadline_bound_s']:.0f} s)",
        ],
        [
            "slow replicas taken for failures; failures no fault explains",
            f"{s['slow_mistaken_for_failures']}; {s['spurious_failures']}",
        ],
        ["recovered in place / by restart", f"{s['in_place']} / {s['by_restart']}"],
        [
            "by a restart: simulator and inference faults; training faults",
            f"{s['loop_faults_by_restart']}; {s['training_faults_by_restart']}",
        ],
        ["iterations redone; env steps redone", f"{s['iterations_redone']}; {count(s['env_steps_redone'])}"],
        ["env steps unaccounted; checkpoints lost", f"{s['env_steps_unaccounted']:.0f}; {s['checkpoints_lost']}"],
        ["wall time: fault-free / with faults", f"{fault_free_wall(s)} / {s['chaos_s']:.0f} s"],
        [
            "env steps/s: fault-free / with faults",
            f"{count(s['fault_free_steps_per_s'])} / {count(s['chaos_steps_per_s'])}",
        ],
        ["throughput, with faults over fault-free", share_down(s["throughput_ratio"])],
        [
            "throughput against the fault-free run before; after",
            f"{share_down(s['throughput_ratio_against_before'])}; {share_down(s['throughput_ratio_against_after'])}"
            if "throughput_ratio_against_before" in s
            else "— (no run after)",
        ],
        [
            "undisturbed iteration (median): fault-free / with faults",
            seconds_pair(s, "fault_free_iteration_median_s", "chaos_undisturbed_iteration_median_s"),
        ],
        [
            "throughput corrected for the machine's drift",
            share_down(s["throughput_ratio_drift_corrected"]) if "throughput_ratio_drift_corrected" in s else "—",
        ],
        [
            "throughput, each fault's cost against its neighbouring iterations",
            share_down(s["throughput_ratio_local"]) if "throughput_ratio_local" in s else "—",
        ],
        [
            "final return (last 10% of iterations): fault-free / with faults",
            f"{s['fault_free_return']:.1f} / {s['chaos_return']:.1f}",
        ],
    ]
    return Block(table(["", "value"], rows, "lr"), [name])


def hosts(res: Results) -> Block:
    """The two-host job by fault: completed, speed, host 1's link, detection and recovery, what was lost."""
    data = res.json(HOSTS)

    def after(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f} s"

    rows = [
        [o["fault"], "yes" if o["completed"] else "no", f"{o['wall_s']:.0f} s", count(o["steps_per_s"])]
        + [f"{o['link_bytes_per_iteration'] / 1e3:.0f} kB", after(o["detected_s"]), after(o["back_s"])]
        + [str(o["iterations_redone"]), str(o["env_steps_unaccounted"]), str(o["checkpoints_lost"])]
        + ["none" if not o["ways_out"] else "; ".join(o["ways_out"])]
        for o in data["runs"]
    ]
    args = data["args"]
    caption = (
        f"*{args['iterations']} iterations, the fault once {args['fault_at']} were logged; link: host 1's, both"
        " ways, per iteration before the fault*"
    )
    header = ["fault", "completed", "wall", "env steps/s", "link", "detected after", "back after"]
    header += ["iterations redone", "env steps unaccounted", "checkpoints lost", "ways out"]
    return Block([caption, "", *table(header, rows, "llrrrrrrrrl")], [HOSTS])


def replacement_spares(res: Results) -> Block:
    """replacement.py: each victim's replacement without spare processes and with, in one run each."""
    data = res.json(SPARES)
    rows = [
        [r["victim"], f"{r['without_s']:.2f} s", f"{r['with_s']:.2f} s", f"{r['ratio']:.1f}x"]
        + [f"+{r['excess_without_s']:.2f} s", f"+{r['excess_with_s']:.2f} s", "yes" if r["spare"] else "no"]
        for r in data["rows"]
    ]
    args = data["args"]
    caption = (
        f"*chaos.py's job, {args['iterations']} iterations, spares off then on; SIGKILL of each process in turn, the"
        f" first {args['first_after']:.0f} s after the workers started, then every {args['every']:.0f} s;"
        f" replacement: from the failure seen to the end of the replacement and its redo; the mean replacement"
        f" {data['ratio']:.2f}x shorter with spares*"
    )
    header = ["killed", "replacement, no spares", "with spares", "shorter", "faulted iteration, no spares"]
    header += ["with spares", "ran in a spare"]
    return Block([caption, "", *table(header, rows, "lrrrrrl")], [SPARES])
