"""The turn core: accepting, running and ending turns of both kinds."""
