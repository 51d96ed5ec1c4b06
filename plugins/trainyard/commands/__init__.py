"""The `trainyard` command's verbs, one module per group; each adds its own sub-commands (`register`). The entry
point, parser and `main` are `trainyard.cli`."""
