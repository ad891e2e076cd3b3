"""Herald server."""
