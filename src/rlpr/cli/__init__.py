"""cli: the `rlpr` command line."""
