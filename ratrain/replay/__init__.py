"""Replaying simulated timelines on a real tiny model: the correctness run (RATrain vs
Baseline-1F1B give the same losses)."""
