"""The base layer: driver errors and lazy init, owned stream/event handles, atomic files."""
