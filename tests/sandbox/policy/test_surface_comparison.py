"""Scratch declarations and the comparison of a turn's files with its declarations (FR-RT-016)."""

from __future__ import annotations

import pytest

from sandbox.policy.declarations import (
    DeclarationProblem,
    compare_surface,
    parse_declared_outputs,
    surface_target,
)

SCRATCH_TMP = {"path": "tmp/**", "role": "scratch"}


def test_a_file_left_in_tmp_is_undeclared_by_default() -> None:
    """Fail closed: a file in tmp/<sid> that nothing declares is an undeclared write."""
    declared = parse_declared_outputs(["report.txt"])
    compared = compare_surface(declared, [("output", "report.txt"), ("tmp", "cache/x")])
    assert compared.undeclared == (("tmp", "cache/x"),)
    assert compared.outputs == ("report.txt",)
    assert not compared.matches
    assert surface_target("tmp", "cache/x") == "tmp/cache/x"


def test_tmp_scratch_allows_every_file_in_tmp_but_not_in_output() -> None:
    """``tmp/**`` scratch covers tmp/<sid> at any depth; output/<sid> still must be exact."""
    declared = parse_declared_outputs(["a.txt", SCRATCH_TMP])
    found = [("tmp", "x"), ("tmp", "d/e/f"), ("output", "a.txt"), ("output", "b.txt")]
    compared = compare_surface(declared, found)
    assert compared.scratch == (("tmp", "d/e/f", "tmp/**"), ("tmp", "x", "tmp/**"))
    assert compared.undeclared == (("output", "b.txt"),)
    assert compared.missing == ()


def test_output_scratch_patterns_match_per_segment() -> None:
    """``build/*.o`` covers object files directly in build/, not deeper or other suffixes."""
    declared = parse_declared_outputs([{"path": "build/*.o", "role": "scratch"}])
    found = [("output", "build/a.o"), ("output", "build/sub/b.o"), ("output", "build/c.txt")]
    compared = compare_surface(declared, found)
    assert [p for _a, p, _src in compared.scratch] == ["build/a.o"]
    assert compared.undeclared == (("output", "build/c.txt"), ("output", "build/sub/b.o"))


def test_a_tmp_pattern_never_covers_the_output_area() -> None:
    """A scratch pattern addresses one area: ``tmp/**`` does not allow output/<sid>/tmp/x."""
    declared = parse_declared_outputs([SCRATCH_TMP])
    compared = compare_surface(declared, [("output", "tmp/x")])
    assert compared.undeclared == (("output", "tmp/x"),)


def test_scratch_is_never_missing_but_outputs_are() -> None:
    """A declared output nobody wrote is missing; a scratch pattern nothing matched is not."""
    declared = parse_declared_outputs(["out.json", SCRATCH_TMP])
    compared = compare_surface(declared, [])
    assert compared.missing == ("out.json",)


def test_wildcards_are_only_allowed_for_scratch() -> None:
    """An output path is a literal file name: ``*`` in it is refused, naming the field."""
    with pytest.raises(DeclarationProblem, match=r"^declared_outputs\[0\]\.path: wildcards"):
        parse_declared_outputs([{"path": "reports/*.txt", "role": "output"}])
    (scratch,) = parse_declared_outputs([{"path": "reports/*.txt", "role": "scratch"}])
    assert (scratch.is_scratch, scratch.area) == (True, "output")


def test_scratch_patterns_obey_the_path_rules() -> None:
    """Scratch patterns are relative and normalised like any declared path."""
    for bad in ("/tmp/**", "tmp/../x", "tmp//x"):
        with pytest.raises(DeclarationProblem, match=r"^declared_outputs\[0\]\.path: "):
            parse_declared_outputs([{"path": bad, "role": "scratch"}])
