"""Stage 3, the numbers: metrics, verdicts, the action flow, reward variance (SNR), the onset
of a run, findings beside a training log. Pure numpy/scipy on arrays: no torch, no I/O."""
