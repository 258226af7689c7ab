"""Stage 2, the model's work: backends behind the same two operations (generate K samples;
log-likelihood of continuations given contexts), the reasoning span of each sample, and the
cross-scoring of every trace under every prompt."""
