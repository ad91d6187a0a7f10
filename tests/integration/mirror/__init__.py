"""The node mirror with the real pieces together (issue 25's end-to-end tests)."""
