"""The control API on control.sock: server, client and the rendering of its answers."""
