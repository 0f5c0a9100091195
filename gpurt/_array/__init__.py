"""The machinery behind gpurt.array: ownership, copies, layout, dtypes, DLPack/CAI interop."""
