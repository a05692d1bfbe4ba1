"""The cluster doctor (``ClusterDoctor``, cluster_doctor.py): the hosts' environments
compared (doctor_env) and the network measured (doctor_net).
"""
