"""The control API's operations, grouped by the noun they act on: `sessions`, `turns`,
`executors`, `escalations`, `ledgers`, and the `daemon` itself (``ping``, ``status``,
``drain``). Each group owns what it needs of the daemon (the turn core, the hub, ...) and
answers its operations' decoded params (`supervisor.wire.control`) with the result's shape
(`supervisor.control.answers`); `supervisor.control.server` holds the table that names them and
the connections that carry them. This package imports no module of its parent's server, so the
server may import every group.
"""
