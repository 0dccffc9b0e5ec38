"""Command-line interface: ``verl <command> ...`` (see :mod:`verl.cli.main`)."""
