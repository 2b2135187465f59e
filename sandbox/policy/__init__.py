# The pure policy core: Phase-21 faults and decisions, Phase-20 envelopes and safety, the seed-003
# classifier and retry protocol, the attempt mapping, reason codes and policy errors.
#
# Purity is this folder: no module here imports anything that does I/O (os, subprocess, socket,
# io, pathlib, threading, time sources, browsers, anyio, asyncio).
# tests/sandbox/policy/test_purity.py walks the folder to keep it so. Clocks, sleeps and the
# attempt runner are injected by the callers.
"""HUMANOID HUNTER policy core (pure: no I/O)."""
