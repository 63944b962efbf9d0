"""Render every table, and the figures quoted in prose, of benchmarks/RESULTS.md from benchmarks/results/.

RESULTS.md holds marker pairs. `<!-- table: NAME -->` ... `<!-- /table -->` is replaced by TABLES[NAME]'s
table (results_tables.py) and one `raw:` line per file it read (from that file's `meta` block);
`<!-- fig: NAME -->` ... `<!-- /fig -->` inside prose is replaced by FIGURES[NAME] (results_figures.py).
Nothing else in the file is touched.

    python benchmarks/render_results.py            # rewrite RESULTS.md in place
    python benchmarks/render_results.py --check    # exit 1 and name each block that differs
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from results_figures import FIGURES
from results_io import Results, ResultsError
from results_tables import TABLES

HERE = Path(__file__).resolve().parent
TABLE = re.compile(r"(?P<open><!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)", re.S)
FIG = re.compile(r"(?P<open><!-- fig: (?P<name>[\w.-]+) -->)(?P<body>.*?)(?P<close><!-- /fig -->)")


class RenderError(Exception):
    """RESULTS.md names a table or figure that TABLES or FIGURES does not have."""


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
    except (RenderError, ResultsError) as exc:
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
