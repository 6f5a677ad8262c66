"""Shared logic of the FlashInfer developer workspace's scripts.

Where code goes:
- A script in scripts/ holds its task: its arguments, its output, its order of steps.
- fidev holds what two users share (scripts, tests), and every fact two files must agree on
  (a path, a file name, a rule of FlashInfer's or Pixi's), stated once.
- Importing any fidev module needs only the standard library, so preflight can diagnose a
  half-installed environment; a third-party package is imported inside the function that needs it,
  which fails in two lines when it is missing.
- Nothing in fidev imports a script. tests/test_layout.py holds these rules.
"""
