"""A cluster's life: its engines and their processes (``EngineSet``, engines.py), and
what changes them through its methods: the start (start_sequence, registration, startup),
the stop (shutdown, fast_stop), a recovery and a grow (recovery, grow, elastic); the
watch on local engines, signals to a rank, and how engines elsewhere are ended.
"""
