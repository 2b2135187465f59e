"""Wire formats: length-prefixed frames and the executor protocol's messages."""
