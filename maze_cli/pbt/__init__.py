"""Population-based training (Jaderberg et al. 2017) on Ray Tune: `train +env=<env> pbt.population=N`.

Each member is an ordinary maze_cli run with its own actors, driven interval by interval by Ray
Tune's PBT scheduler (maze_cli.cli.population, maze_cli.cli.member); a member that falls behind copies
a better member's checkpoint (weights, optimizer, normalizers and counters: data, never code) and
perturbs the keys of `pbt.mutations`, which the learner applies from its next update (`mutations`),
without a restart. This package holds what needs neither Ray nor a run: the keys and the record.
"""
