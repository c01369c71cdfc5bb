"""The command line, `python -m tokenswift ...`."""
