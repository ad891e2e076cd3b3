"""Herald spark_bridge."""
