"""The `gpurt` command's reports: info and the demo tour."""
