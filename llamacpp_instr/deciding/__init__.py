"""Deciding the next run from logs and models: what fits (``fit``), how fast a setting would run
(``prediction/``), and which settings to choose (``plan``, ``moe_plan`` for a mixture of experts'
placements, ``replay_verdict`` among the settings a recorded traffic was replayed under). What runs
a model or measures the machine for them lives in ``running``."""
