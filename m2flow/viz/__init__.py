"""The dry run: what the plan is and why, as text, pictures and plan.json. Starts nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rich.console import Console

from m2flow.graph import MacroGraph
from m2flow.schedule import Plan
from m2flow.viz.gantt import draw_gantt, write_gantt_html
from m2flow.viz.tables import candidates_table, placement_table, sources_line, timeline_table


def write_dry_run(graph: MacroGraph, plan: Plan, out: str | Path, console: Console) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    console.print(placement_table(plan))
    console.print(timeline_table(plan))
    console.print(candidates_table(plan))
    console.print(sources_line(plan.predicted.cost_sources))
    for note in plan.notes:
        console.print(note)
    written = [plan.save(out / "plan.json")]
    dot = out / "graph.dot"
    dot.write_text(graph.to_dot())
    written.append(dot)
    if shutil.which("dot"):
        svg = out / "graph.svg"
        subprocess.run(["dot", "-Tsvg", str(dot), "-o", str(svg)], check=True, timeout=60)
        written.append(svg)
    else:
        console.print("graphviz 'dot' is not installed: wrote graph.dot only (apt-get install graphviz)")
    written.append(draw_gantt(plan, out / "gantt.png"))
    written.append(write_gantt_html(plan, out / "gantt.html"))
    return written
