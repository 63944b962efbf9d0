"""A Gantt chart of the predicted micro schedule: one row per device, one bar per task."""

from __future__ import annotations

from pathlib import Path

from m2flow.plan import Plan


def draw_gantt(plan: Plan, path: str | Path, max_tasks: int = 4000) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = plan.tasks[:max_tasks]
    devices = sorted({t.device for t in tasks})
    workers = sorted({t.worker for t in tasks})
    palette = plt.get_cmap("tab10")
    colour = {w: palette(i % 10) for i, w in enumerate(workers)}
    row = {d: i for i, d in enumerate(devices)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(devices)))
    for task in tasks:
        ax.barh(
            row[task.device],
            task.end - task.start,
            left=task.start,
            height=0.8,
            color=colour[task.worker],
            edgecolor="black",
            linewidth=0.2,
        )
    ax.set_yticks(range(len(devices)), devices)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (predicted)")
    steps = plan.predicted.get("simulated_steps", 0)
    ax.set_title(
        f"{plan.workflow}: {plan.mode}, {plan.pipeline_stages} stage(s); "
        f"first {steps} loop steps simulated, the rest extrapolated"
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[w]) for w in workers]
    ax.legend(handles, workers, loc="upper right", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
