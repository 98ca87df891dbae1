"""attntune.policies — cache index, policies, plans, dispatch, telemetry."""
