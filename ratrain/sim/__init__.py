"""The event simulator of one training step: pipeline orders (1F1B, GPipe), the lifecycle tasks
(GradSync, UpdateShard, PrefetchW, recovery) on their resources, the timeline, traces and plots."""
