"""Herald's delivery engine: a sans-I/O core per subscription and a thin async engine."""
