"""Checkpoint formats, one module each (detect, load, the files that define it); the
registry that tries them in order is `collapsecheck.inputs.checkpoint`."""
