"""collapsecheck inside a trainer: `trl.CollapseCallback` for TRL's trainers, and
`any_trainer.diagnose_batch` for veRL or any trainer that holds its rollouts as token ids and
can score token ids with its own policy."""
