"""What every table of benchmarks/RESULTS.md is made of: a Block (its lines and the files it read), a
markdown table, and the number formats the tables share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
