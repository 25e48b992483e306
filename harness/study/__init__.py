"""Studies: preregistration, the deterministic plan, attempts, the runner and the report."""
