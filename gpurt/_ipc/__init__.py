"""Machinery of gpurt.ipc: the handle format and the shared importer counters."""
