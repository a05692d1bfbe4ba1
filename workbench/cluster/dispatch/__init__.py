"""Running code on the ranks (``RankDispatch``, rank_dispatch.py): sending work, waiting
(stuck ranks, fail-together, hang reports, health), the direct cell routes and their live
output, the debug inbox, scripts, cell results and the autopsy.
"""
