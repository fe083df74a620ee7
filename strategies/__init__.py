"""Aggregation methods: one module per method (pure maths + a thin Strategy), and a
registry (:mod:`strategies.registry`) that picks one by the ``method`` run-config key."""
