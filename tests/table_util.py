"""Markdown tables read by column name: a test that reads a cell by position breaks silently
when a column is added (the ablation table's ``conditions`` became its last column)."""

from __future__ import annotations

from typing import Dict, List


def _cells(line: str) -> List[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def markdown_rows(text: str) -> List[Dict[str, str]]:
    """The body rows of the first markdown table in ``text``, each a dict from the header's
    column names to the row's cells. ``ValueError`` when there is no table or a row has
    another number of cells than the header (a ``|`` inside a cell)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("|")), None)
    if start is None:
        raise ValueError("no markdown table in the text")
    table = []
    for line in lines[start:]:  # the first table: up to the first line outside it
        if not line.lstrip().startswith("|"):
            break
        table.append(line)
    header = _cells(table[0])
    rows = []
    for line in table[2:]:  # past the header and its |---| line
        cells = _cells(line)
        if len(cells) != len(header):
            raise ValueError(f"a row of {len(cells)} cells under {len(header)} columns: {line}")
        rows.append(dict(zip(header, cells)))
    return rows
