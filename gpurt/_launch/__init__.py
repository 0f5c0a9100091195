"""Kernel launch: the Kernel object, argument plans, parameter types, the C launch path."""
