"""Stage 1, what the user points at: prompt sets, checkpoints (and their formats), a run's
checkpoints, rollout files (generic and the trainers' own), reward functions, training logs.
Everything here reads and checks files before any model loads."""
