"""Choosing a configuration: the analytic step estimator (Eq. 11-13) and the planner
(Algorithm 2) that searches the memory-feasible space."""
