"""CLI sub-commands, one module per capability."""
