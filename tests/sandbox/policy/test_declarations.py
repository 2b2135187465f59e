"""The one DeclaredOutput and its parser (sandbox/policy/declarations.py)."""

from __future__ import annotations

import pytest

from sandbox.policy.declarations import (
    DEFAULT_ROLE,
    DeclarationProblem,
    DeclaredOutput,
    parse_declared_outputs,
)


def test_empty_list_is_valid() -> None:
    assert parse_declared_outputs([]) == ()
    assert parse_declared_outputs(()) == ()


def test_entries_in_every_accepted_shape() -> None:
    parsed = parse_declared_outputs(
        [
            "a.txt",
            {"path": "sub/b.txt", "role": "report"},
            {"path": "c.txt", "role": None},
            {"path": "d.txt"},
            DeclaredOutput("e.txt", "log"),
        ]
    )
    assert parsed == (
        DeclaredOutput("a.txt"),
        DeclaredOutput("sub/b.txt", "report"),
        DeclaredOutput("c.txt", DEFAULT_ROLE),
        DeclaredOutput("d.txt", "output"),
        DeclaredOutput("e.txt", "log"),
    )
    assert parsed[1].to_dict() == parsed[1].to_wire() == {"path": "sub/b.txt", "role": "report"}


def test_parsing_its_own_wire_form_is_the_identity() -> None:
    parsed = parse_declared_outputs(["x", {"path": "y/z", "role": "r"}])
    assert parse_declared_outputs([d.to_wire() for d in parsed]) == parsed


@pytest.mark.parametrize(
    ("value", "field", "problem"),
    [
        (None, "declared_outputs", "required"),
        ("a.txt", "declared_outputs", "must be a list"),
        ({"path": "a"}, "declared_outputs", "must be a list"),
        (7, "declared_outputs", "must be a list"),
        ([3], "declared_outputs[0]", "must be a path or an object"),
        (["ok", None], "declared_outputs[1]", "must be a path or an object"),
        ([""], "declared_outputs[0].path", "required non-empty string"),
        ([{"role": "r"}], "declared_outputs[0].path", "required non-empty string"),
        ([{"path": 5}], "declared_outputs[0].path", "required non-empty string"),
        (["/etc/passwd"], "declared_outputs[0].path", "must be a relative path"),
        (["a\0b"], "declared_outputs[0].path", "must be a relative path"),
        (["a/../b"], "declared_outputs[0].path", "must be normalised"),
        (["./a"], "declared_outputs[0].path", "must be normalised"),
        (["a//b"], "declared_outputs[0].path", "must be normalised"),
        (["dir/"], "declared_outputs[0].path", "must be normalised"),
        (["x" * 5000], "declared_outputs[0].path", "at most 4096"),
        (["a", "b", "a"], "declared_outputs[2].path", "declared twice"),
        ([{"path": "a", "role": ""}], "declared_outputs[0].role", "non-empty string"),
        ([{"path": "a", "role": 3}], "declared_outputs[0].role", "non-empty string"),
        ([{"path": "a", "role": "r" * 201}], "declared_outputs[0].role", "at most 200"),
    ],
)
def test_problems_name_the_index_and_field(value: object, field: str, problem: str) -> None:
    with pytest.raises(DeclarationProblem) as info:
        parse_declared_outputs(value)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(info.value) == f"{field}: {info.value.problem}"
    assert isinstance(info.value, ValueError)


def test_field_name_can_be_given() -> None:
    with pytest.raises(DeclarationProblem, match=r"^outputs\[0\]\.path: "):
        parse_declared_outputs(["/x"], field="outputs")


def test_one_class_everywhere() -> None:
    """The runtime and the daemon's intake use this very class."""
    from sandbox.runtime import DeclaredOutput as RuntimeDeclaredOutput
    from supervisor.turns.requests import DeclaredOutput as RequestDeclaredOutput

    assert RuntimeDeclaredOutput is DeclaredOutput
    assert RequestDeclaredOutput is DeclaredOutput
