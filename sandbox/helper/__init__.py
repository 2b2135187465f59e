"""The sandbox helper: the root half of a privilege-separated daemon.

``hunter sandbox-helper`` (server.py) runs as root in its own unit and does only what needs
root: a session's uid, directories and session disk, Landlock, namespaces, cgroups, seccomp
notifications, kernel audit records, the enumeration of a turn's writes and their promotion.
The daemon runs unprivileged and reaches it over one Unix socket (remote.py, `RemoteArea`),
with the typed messages of wire.py. The daemon keeps every ledger: the helper seals nothing.
docs/operations.md ("Privilege separation") says how to run it.
"""
