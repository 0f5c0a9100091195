"""The base layer, which imports nothing else of gpurt: driver errors and lazy init
(driver.py), per-thread state (state.py), at-fork steps (fork.py), the capture count
(captures.py), atomic files (files.py)."""
