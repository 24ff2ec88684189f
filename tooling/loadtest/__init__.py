"""`slogate loadtest` and `slogate calibrate`'s work: a workload played against a live stack.

What lives here: run (run_live and the policies it runs under), shots (sending and measuring
each request), scrape (processes, the signals' timeline, the drain), faults (injected during
a run), report (tables per tier and tenant), predict (the simulator's prediction of a run, and
capacity), calibrate (endpoints measured into a latency model). The command line is
tooling.cli.loadtest / tooling.cli.calibrate.
"""
