"""attntune.policies — cache index, policies, plans, dispatch, telemetry.

``config`` (environment switches) → ``index`` (valid cached winners) → ``policy`` (how a problem
becomes a plan; the heuristic rule table) → ``plan`` (the Plan and ``plan(problem)``) → ``runtime``
(process state: plans, slots, quarantine, misses) → ``dispatch`` (hot path, custom op, F.sdpa patch)
→ ``telemetry`` (stats, Prometheus).
"""

from attntune.policies.plan import Plan, plan

__all__ = ["Plan", "plan"]
