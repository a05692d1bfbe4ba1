"""Training runs on a cluster, seen from the kernel: the step machine of a built-in or a
user's own model, its checkpoints and recovery, and the traced loop's event log.

Sessions sit above ``workbench.cluster`` (they send work to its ranks) and below the
stepper, the magics and the plots (which draw what a session recorded).
"""
