"""Tools: programs over the loaders — `bench`, `show`, the demo and the `tbljax` command."""
