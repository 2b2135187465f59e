"""The operators' console (`hunter console`): a web page for turns, sessions, executors,
escalations and ledgers, in a process of its own that is a client of the daemon's control API
(`supervisor.client`); the daemon's hot path carries no HTTP. It may import `supervisor.client`,
`supervisor.feed` and `supervisor.logging`, never the daemon's internals.

Modules: `app` (the ASGI application), `pages` (what operators read), `actions` (what resolvers
change), `signin_pages` and `signins` (who is signed in), `operators` (the operators file),
`guard` (the Host check, authentication, CSRF, form types, headers), `hosts` (the names it
answers to), `ids` (the ids it checks before the daemon sees them), `stream` and `live` (the
live changes, one subscription fanned out to every browser), `timeline` and `charts` (pure
drawing), `render` (templates), `server` (hypercorn, signals), `cli` (`hunter console`).
"""
