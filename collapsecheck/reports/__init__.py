"""Stage 5, what the user reads: the report and run report types, the SPEC dump, the console,
the plot, the gate and its CI reports, the comparison of two reports, the output files."""
