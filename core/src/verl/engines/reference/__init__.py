"""Reference engines: single-process PyTorch/HF implementations of the engine protocols.

They run wherever torch runs (the CPU default) and are the numerical oracle for backend plugins.

* :mod:`verl.engines.reference.rollout` — ``HFRolloutEngine`` / ``build_hf_rollout`` (rollout engine ``hf``).
* :mod:`verl.engines.weight_sync.colocated` — ``ColocatedCheckpointEngine`` (weight sync ``colocated``).
* :mod:`verl.engines.reference.postprocess`, :mod:`verl.engines.reference.sampling` — rollout helpers.

Submodules are imported explicitly (nothing is imported here) so that using one engine never pulls in
the others.
"""
