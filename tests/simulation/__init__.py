"""A deterministic simulator that runs payonce's real client, drive and journal against a
model world (provider, network, clocks, processes) chosen step by step from a seed.

Issue 26. ``_world.run_world`` runs one seed; ``run.py`` (``make simulate``) runs many;
``test_simulation.py`` runs a fixed set in the suite. Each module is one idea of the world:

- ``_choices``: every decision of a run, drawn from a seed or replayed from a list;
- ``_clocks``: the true time, the host's wall and boot clocks, the provider's clock;
- ``_provider``: the provider's idempotency semantics, executions per business operation;
- ``_network``: the wire between a process and the provider, and its faults;
- ``_edges``: where payonce's I/O edges (time, entropy, liveness, lease keeping) are
  replaced for the run; never a decision of payonce;
- ``_processes``: simulated processes as greenlets, switched at every command boundary;
- ``_shop``: the application code the processes run;
- ``_invariants``: what must hold after every step and at the end;
- ``_shrink``: the shortest list of choices that still breaks an invariant.
"""
