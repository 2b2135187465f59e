"""FR-RT-002/003: ``capabilities.execute`` is a list of allowed commands, arguments included.

Real sandboxed turns: an allowed argv runs; a disallowed one is rejected before anything runs,
as a capability violation in the evidence ledger. A bad pattern is a manifest error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.capabilities import compile_capabilities
from sandbox.errors import ManifestError
from sandbox.packages import load_package
from sandbox.runtime import Runtime, Session, TurnResult

Installer = Callable[..., Path]


def caps(*execute: str) -> dict[str, object]:
    return {"read": [], "write": ["**"], "execute": list(execute), "forbidden": []}


def violations(session: Session, turn_number: int) -> list[dict[str, Any]]:
    """The capability violations the evidence ledger holds for a turn."""
    path = session.ledgers.session_dir / "ledger" / "evidence.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [
        v
        for e in entries
        if e.get("turn_number") == turn_number and e.get("kind") == "capability_violation"
        for v in e["capability_violations"]
    ]


async def run(session: Session, argv: list[str]) -> TurnResult:
    return await session.run_process_turn(argv, declared_outputs=[], timeout_ms=10_000)


@pytest.mark.usefixtures("sandboxed")
async def test_argument_patterns_allow_only_matching_argv(root: Path, install: Installer) -> None:
    """``echo hello **`` runs ``echo hello world``; ``echo bye`` is rejected and recorded."""
    install("pkg", capabilities=caps("echo hello **", "/bin/true"))
    with Runtime(root) as runtime, runtime.open_session("pkg") as session:
        ok = await run(session, ["echo", "hello", "world"])
        assert (ok.status, ok.stdout) == ("succeeded", "hello world\n")
        bare = await run(session, ["echo", "hello"])
        assert bare.status == "succeeded"
        refused = await run(session, ["echo", "bye"])
        assert (refused.status, refused.reason_code) == ("rejected", "CAPABILITY_REJECTED")
        assert refused.attempts == ()
        (violation,) = refused.violations
        assert violation.capability == "capabilities.execute"
        (recorded,) = violations(session, 3)
        assert recorded["capability"] == "capabilities.execute"
        assert recorded["target"] == "echo"
        assert "arguments ['bye'] match no allowed command ('echo hello **')" in recorded["detail"]
        # an entry without argument patterns still allows any arguments
        assert (await run(session, ["/bin/true", "--anything", "goes"])).status == "succeeded"


@pytest.mark.usefixtures("sandboxed")
async def test_the_seed_example_allows_exactly_its_argv(
    root: Path, install: Installer, world: Path, system_python: str
) -> None:
    """``python3 <script> --explain`` runs the script with ``--explain`` and nothing else: no
    other flag, no ``-c`` code, no extra argument."""
    scripts = world / "scripts"
    scripts.mkdir(mode=0o755)
    trace = scripts / "trace.py"
    trace.write_text("import sys\nprint('explained', sys.argv[1:])\n")
    trace.chmod(0o644)
    capabilities = caps(f"python3 {trace} --explain")
    capabilities["read"] = [f"{scripts}/**"]
    install("pkg", capabilities=capabilities)
    with Runtime(root) as runtime, runtime.open_session("pkg") as session:
        ok = await run(session, ["python3", str(trace), "--explain"])
        assert (ok.status, ok.stdout) == ("succeeded", "explained ['--explain']\n"), ok.stderr
        for argv in (
            ["python3", str(trace), "--explain", "--more"],
            ["python3", str(trace)],
            ["python3", "-c", "print('escaped')"],
            [system_python, str(trace), "--trace"],
        ):
            result = await run(session, argv)
            assert result.status == "rejected", argv
            assert "escaped" not in result.stdout
        assert len(violations(session, 5)) == 1


def test_wildcards_in_arguments(tmp_path: Path) -> None:
    """``*`` in a token is any run of characters; ``**`` any number of whole arguments;
    the rest is literal, and the program must still match."""
    compiled = compile_capabilities(
        read=[],
        write=[],
        execute=["/bin/echo --level=* ** end", "/bin/echo 'two words'"],
        forbidden=[],
        workspace=tmp_path,
    )
    echo = compiled.execute[0].absolute

    def allowed(*args: str) -> bool:
        return compiled.check_execute(echo, args=args).allowed

    assert allowed("--level=3", "end")
    assert allowed("--level=a/b", "x", "y", "end")
    assert allowed("two words")
    assert not allowed("--level=3")
    assert not allowed("--levelx", "end")
    assert not allowed("two", "words")
    assert not allowed()
    assert compiled.check_execute(echo).allowed  # the program alone (what the kernel sees)
    assert not compiled.check_execute("/usr/bin/env", args=["--level=1", "end"]).allowed


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("python3 'unterminated", "not a command pattern: no closing quotation"),
        ("** --x", "not a command pattern: '**' cannot be the program"),
        ("'' --x", "not a command pattern: no program"),
    ],
)
def test_a_bad_command_pattern_is_a_manifest_error(
    root: Path, install: Installer, entry: str, problem: str
) -> None:
    """The error names the manifest, the entry's JSON path, the entry and the problem."""
    install("pkg", capabilities=caps("/bin/true", entry))
    with pytest.raises(ManifestError) as caught:
        load_package(root, "pkg")
    assert str(caught.value).endswith(f"$.capabilities.execute[1]: {entry!r}: {problem}")
