"""How policies are judged against each other: the goals the benchmarks check and the tests pin.

The scripts in `benchmarks/` parse arguments, run replays in parallel and print; what they
compute lives here, so that a test checks the same code a benchmark runs:

- `named_traces`: the named traces and the synthetic workload the trace benchmarks replay, and
  the variants that probe a result (submissions jittered, quotas zeroed).
- `trace_goals`: the goals on the named traces, and each policy judged against the others.
- `goodput_draws`: goodput over draws of the arrival order, ours beside its peers.
- `family_goals`: the four goals of the policy family, judged on one draw.
- `family_summary`: what the family's draws add up to: counts, worst draws, the ceiling.
- `oracle`: CP-SAT hindsight schedules and refutations on small draws (needs `ortools`, the
  `oracle` extra; nothing else here imports it).
"""
