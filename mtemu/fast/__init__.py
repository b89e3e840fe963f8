"""The machine's speed paths, each identical in counters and data to running bundle by bundle.

- :mod:`mtemu.fast.runs`: straight-line runs of data-only bundles, their per-PC counter deltas and
  address ranges, so the machine takes a run in one step.
- :mod:`mtemu.fast.queues`: functional mode's data of those runs (:func:`~mtemu.fast.queues.run_plain`)
  and the queue per DSP where it, and DMAs into AM, wait until something looks at their state.
- :mod:`mtemu.fast.fused`: a run's multiply-accumulate core compiled once and run blocked.
- :mod:`mtemu.fast.simd`: sixteen FP32 lanes as one value in jitted code.
- :mod:`mtemu.fast.prepared`: the tables derived from a named program, on disk between processes.
"""
