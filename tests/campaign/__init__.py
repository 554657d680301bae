"""The fault campaign of the runtime (issue 13): kill fuzzing, disk full, bad input.

- ``plan``: seeded plans of the runs (rounds of 2-3 concurrent tool calls).
- ``child``: the forked child that runs (or resumes) one planned run.
- ``kill_fuzz``: starts children, kills or interrupts them at random instants, and checks
  what the store holds after every fault.
- ``report``: writes ``docs/reliability.md`` from what ran.

``tests/runtime/test_campaign.py`` runs it; counts and seed come from the environment (see there).
"""
