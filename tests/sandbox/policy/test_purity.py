"""The pure policy modules import no I/O module (seed 000/001 section 8), checked on the AST."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sandbox

SANDBOX_DIR = Path(sandbox.__file__).parent
POLICY_DIR = SANDBOX_DIR / "policy"
#: The seed's own module names (Phase-21), kept importable as re-exports of `sandbox.policy`.
SEED_MODULES = ("sandbox_types", "sandbox_context", "sandbox_engine")
#: Purity is a folder: every module under sandbox/policy/, plus the package's own __init__ and
#: the seed-name modules, which re-export it.
PURE_FILES = (
    SANDBOX_DIR / "__init__.py",
    *(SANDBOX_DIR / f"{name}.py" for name in SEED_MODULES),
    *sorted(POLICY_DIR.rglob("*.py")),
)
PURE_MODULES = tuple(str(p.relative_to(SANDBOX_DIR.parent).with_suffix("")) for p in PURE_FILES)

BANNED = frozenset(
    {
        "os",
        "subprocess",
        "socket",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "threading",
        "multiprocessing",
        "asyncio.subprocess",
        "ctypes",
        "playwright",
        "selenium",
        "pyppeteer",
        "urllib",
        "http",
        "requests",
        "sqlite3",
        "importlib",
        "anyio",
        "trio",
        "asyncio",
        "time",
    }
)
DYNAMIC_IMPORTERS = frozenset({"__import__", "import_module", "exec", "eval", "open"})


def _banned(module: str) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in BANNED for i in range(1, len(parts) + 1))


def violations(source: str) -> list[str]:
    """Every banned import, dynamic import or impure sandbox import in ``source``."""
    found: list[str] = []
    pure = {"sandbox.policy", *(f"sandbox.{name}" for name in SEED_MODULES)}
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                found.append(f"relative import of {base!r}")
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            names = [name for name in names if name]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called in DYNAMIC_IMPORTERS:
                found.append(f"call to {called}()")
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in {"__import__", "__builtins__"}:
                found.append(f"reference to {name}")
        for name in names:
            if _banned(name):
                found.append(f"import of {name}")
            root = name.split(".")[0]
            if (
                root == "sandbox"
                and name != "sandbox"
                and not any(name == module or name.startswith(f"{module}.") for module in pure)
            ):
                found.append(f"import of impure {name}")
    return found


@pytest.mark.parametrize("path", PURE_FILES, ids=PURE_MODULES)
def test_pure_module_imports_nothing_that_does_io(path: Path) -> None:
    """Each pure policy module imports no I/O, process, network, browser or dynamic importer."""
    assert violations(path.read_text(encoding="utf-8")) == []


def test_pure_module_list_is_complete() -> None:
    """The seed's module names exist and the whole policy folder is walked."""
    for name in SEED_MODULES:
        assert (SANDBOX_DIR / f"{name}.py").is_file()
    for name in ("faults", "context", "engine", "envelopes", "safety", "attempts"):
        assert f"sandbox/policy/{name}" in PURE_MODULES


@pytest.mark.parametrize(
    "snippet",
    [
        "import os",
        "import anyio",
        "from asyncio import sleep",
        "import time",
        "import os.path",
        "import subprocess as sp",
        "from os import system",
        "from os.path import join",
        "import socket",
        "import io",
        "from pathlib import Path",
        "import shutil, json",
        "import tempfile",
        "import threading",
        "import multiprocessing.pool",
        "from asyncio import subprocess",
        "import asyncio.subprocess",
        "import ctypes",
        "from playwright.sync_api import sync_playwright",
        "import selenium.webdriver",
        "import pyppeteer",
        "from urllib.request import urlopen",
        "import http.client",
        "import requests",
        "import sqlite3",
        "import importlib",
        "from importlib import import_module",
        "m = __import__('os')",
        "m = getattr(__builtins__, '__import__')('os')",
        "import importlib as il\nil.import_module('os')",
        "exec('import os')",
        "f = open('x')",
        "from sandbox import runtime",
        "from sandbox.runtime.session import Runtime",
        "import sandbox.packages",
        "from . import sandbox_types",
        "import sandbox.confine.landlock",
        "from sandbox.runtime import Session",
    ],
)
def test_checker_catches_every_forbidden_form(snippet: str) -> None:
    """The checker itself works: each forbidden import form is reported."""
    assert violations(snippet) != []


@pytest.mark.parametrize(
    "snippet",
    [
        "import re",
        "from collections.abc import Mapping",
        "from sandbox.policy import reason_codes",
        "from sandbox.policy.faults import ExecutionFaultType",
        "import json",
    ],
)
def test_checker_allows_pure_imports(snippet: str) -> None:
    """Pure imports (stdlib logic, anyio, other pure sandbox modules) are not reported."""
    assert violations(snippet) == []
