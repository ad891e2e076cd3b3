"""Herald client."""
