"""Herald web_console."""
