"""From kernels to per-layer task costs: latency profiles emulated on mtemu, and the cost terms
(compute, recovery, collectives, update, prefetch) that feed the simulator and the planner."""
