"""The `ppdkit` command line and what it prints."""
