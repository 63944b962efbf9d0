"""A Gantt chart of the predicted micro schedule: one row per device, one bar per task."""

from __future__ import annotations

from pathlib import Path

from m2flow.schedule import Plan, Task


def earliest(plan: Plan, count: int) -> list[Task]:
    """The first `count` tasks to start (a large plan's chart shows the start of its iteration on every
    device, not some devices' whole iteration)."""
    return sorted(plan.tasks, key=lambda t: (t.start, t.id))[:count]


def draw_gantt(plan: Plan, path: str | Path, max_tasks: int = 4000) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = earliest(plan, max_tasks)
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
            alpha=0.8,  # bars overlap on a CPU core that processes share
            edgecolor="black",
            linewidth=0.2,
        )
    loop = [t for t in tasks if t.phase == "loop"]
    after = [t for t in tasks if t.phase in ("then", "swap") and loop and t.start >= max(x.end for x in loop)]
    if loop and after:
        gap_start, gap_end = max(t.end for t in loop), min(t.start for t in after)
        if gap_end > gap_start:
            ax.axvspan(gap_start, gap_end, color="#eeeeee", hatch="//", zorder=0)
            ax.text(
                (gap_start + gap_end) / 2,
                (len(devices) - 1) / 2,
                "remaining loop steps (extrapolated)",
                ha="center",
                va="center",
                fontsize="small",
            )
    ax.set_yticks(range(len(devices)), [d.name for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (predicted)")
    steps = plan.predicted.simulated_steps
    ax.set_title(
        f"{plan.workflow}: {plan.mode}, {plan.pipeline_stages} stage(s); "
        f"first {steps} loop steps simulated, the rest extrapolated"
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[w]) for w in workers]
    ax.legend(handles, workers, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_gantt_html(plan: Plan, path: str | Path, max_tasks: int = 6000) -> Path:
    """The same chart as one self-contained HTML page: hover a bar for its task (SVG <title>)."""
    from html import escape

    tasks = earliest(plan, max_tasks)
    devices = sorted({t.device for t in tasks})
    workers = sorted({t.worker for t in tasks})
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    colour = {w: palette[i % len(palette)] for i, w in enumerate(workers)}
    end = max((t.end for t in tasks), default=1.0) or 1.0
    width, row_h, left = 1100, 28, 110
    scale = (width - left - 10) / end
    bars = []
    for t in tasks:
        y = 30 + devices.index(t.device) * row_h
        shared = (
            f", {t.work_s * 1e3:.3f} ms of work: the core is shared"
            if 0 < t.work_s < (t.end - t.start) * (1 - 1e-9)
            else ""
        )
        tip = (
            f"{t.worker}[{t.replica}].{t.port} on {t.device}\n{t.phase}, step {t.step}, slice {t.stage}\n"
            f"{t.start * 1e3:.3f} -> {t.end * 1e3:.3f} ms ({(t.end - t.start) * 1e3:.3f} ms{shared})"
        )
        bars.append(
            f'<rect x="{left + t.start * scale:.2f}" y="{y}" width="{max(0.5, (t.end - t.start) * scale):.2f}"'
            f' height="{row_h - 6}" fill="{colour[t.worker]}" fill-opacity="0.8"><title>{escape(tip)}</title></rect>'
        )
    labels = [f'<text x="4" y="{30 + i * row_h + 16}">{escape(d.name)}</text>' for i, d in enumerate(devices)]
    legend = " ".join(f'<span style="color:{colour[w]}">&#9632; {escape(w)}</span>' for w in workers)
    height = 40 + len(devices) * row_h
    predicted = plan.predicted
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{escape(plan.workflow)} plan</title>
<style>body{{font-family:sans-serif;margin:16px}} svg text{{font-size:12px}} rect:hover{{stroke:#000}}</style></head>
<body><h3>{escape(plan.workflow)}: {escape(plan.mode)}, {plan.pipeline_stages} stage(s)</h3>
<p>predicted {predicted.iteration_s:.4g} s per iteration, {predicted.env_steps_per_s:,.0f} env steps/s;
first {predicted.simulated_steps} loop steps simulated, the rest extrapolated. Hover a bar.</p>
<p>{legend}</p><svg width="{width}" height="{height}">{"".join(labels)}{"".join(bars)}</svg></body></html>"""
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
