"""The hosts a cluster runs on: this host's GPUs, engines placed on named hosts, spare
hosts for a lost one's ranks, telling a lost host from a dead process (Slurm's node state
too), the heartbeat fence, and every rank reaching rank 0 before the group forms.
"""
