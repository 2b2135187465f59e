"""What the commands print: aligned tables and JSON."""

from __future__ import annotations

import pytest

from supervisor.cli.output import err, out, table, to_json


def test_table_aligns_columns_and_blanks_none() -> None:
    """Columns are as wide as their widest cell; None is an empty cell; no trailing spaces."""
    text = table(("ID", "NAME", "NOTE"), [(1, "alpha", None), (22, "b", "x")])
    assert text.splitlines() == [
        "ID  NAME   NOTE",
        "--  -----  ----",
        "1   alpha",
        "22  b      x",
    ]


def test_lines_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """out/err add one newline only when missing; JSON is indented with sorted keys."""
    out("a")
    out("b\n")
    err("c")
    captured = capsys.readouterr()
    assert captured.out == "a\nb\n"
    assert captured.err == "c\n"
    assert to_json({"b": 1, "a": [2]}) == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}'
