"""From an edit of the vendored tree to its modules, their tests and a verdict."""
