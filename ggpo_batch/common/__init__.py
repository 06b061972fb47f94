"""Helpers every floor may use: input limits at the edge, safe reads of outside files, packaged data,
the `--json` schema numbers, ports and the parent-death signal. Imports only `errors`.
"""
