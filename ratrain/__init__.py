"""ratrain: 1F1B training-state lifecycle simulator and resource-aware planner."""
__version__ = "0.1.0"
