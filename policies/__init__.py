"""attntune.policies — cache index, policies, plans, dispatch, telemetry.

``config`` (environment switches) → ``index`` (valid cached winners) → ``policy`` (how a problem
becomes a plan; the heuristic rule table) → ``plan`` (the Plan) → ``runtime`` (process state: plans,
slots, quarantine, misses; ``plan(problem)``) → ``dispatch`` (hot path, custom op, F.sdpa patch)
→ ``telemetry`` (stats, Prometheus). Each module imports only those before it.
"""

__all__ = ["Plan"]  # plan(problem): attntune.plan, i.e. attntune.policies.runtime.plan


def __getattr__(name: str):
    # Lazily: importing a light submodule (config) must not load the runtime, the cache and the kernels.
    if name == "Plan":
        from attntune.policies.plan import Plan

        return Plan
    raise AttributeError(f"module 'attntune.policies' has no attribute {name!r}")
