# The supervisor daemon: control API, executor protocol, dispatch, intake, CLI.
# Layering: supervisor may import sandbox and ledger; nothing imports supervisor.
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("humanoid-hunter")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
