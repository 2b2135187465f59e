# Kernel confinement of process turns: Landlock rulesets, cgroups, the confined spawn and its
# native launcher. Imports `ledger` never and `supervisor` never; the runtime composes these.
"""Confinement mechanisms of the sandbox (Landlock, cgroups, namespaces, spawn)."""
