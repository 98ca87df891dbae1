"""attntune.autotune — suites, correctness gate, timing and the optuna sweep (`attntune tune`)."""
