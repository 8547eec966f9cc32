"""Markdown tables of numbers, as every generated block and report.md write them."""

from __future__ import annotations


def fmt(value, digits: int = 3) -> str:
    """`digits` decimals (significant ones below 0.01); — for a missing value."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if 0 < abs(value) < 0.01 and digits else f"{value:.{digits}f}"
    return str(value)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
