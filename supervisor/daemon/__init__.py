"""The daemon's start-up pieces, apart from `supervisor.server.Daemon` that runs them in order:
the root's lock (`root_lock`), opening the configured turn store (`store`), the listening
sockets, systemd's included (`listeners`), the parts' settings read from the configuration
(`settings`), the reload of its reloadable keys (`reload`), and one known asyncio race
(`loop_races`). Each changes for its own reason (a new store engine, a new socket, a new
setting) without touching the daemon's lifecycle. Nothing here imports `supervisor.server`.
"""
