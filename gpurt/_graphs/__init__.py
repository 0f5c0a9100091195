"""The machinery behind gpurt.graphs: capture state and graph kernel nodes."""
