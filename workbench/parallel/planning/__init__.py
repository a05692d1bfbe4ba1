"""The bridge from runs to the planner: a model, a run or a measurement turned into the
planner's specs and plans, so what the workbench measures can be held against what the
planner predicts.

``spec_from_model`` (a ``ModelSpec`` counted on the meta device), ``measure`` (activation
bytes from one traced forward), ``plan_from`` (``wb.plan_from``: the user's model at cluster
scale), ``run_plan`` (the plan of a run the workbench executes), ``commbench`` (all-reduce
time against message size, to calibrate the network model). The planner itself
(``workbench.planner``) never imports torch; this package is where torch meets it.
"""
