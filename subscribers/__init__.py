"""Herald subscribers."""
