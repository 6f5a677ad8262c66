"""The library of the FlashInfer developer workspace's tasks, in parts by concern.

Where code goes:
- A script in scripts/ is a task: it parses its arguments, calls library steps in order and prints.
  No script imports another script; maintainer tools (tools/) follow the same rule.
- fidev holds every step two users share and every fact two files must agree on (a path, a file
  name, a rule of FlashInfer's or Pixi's), stated once, in one part:

  core      failures and exit statuses, files, versions, the manifest, the package index, the workspace's paths
  tree      the vendored FlashInfer tree: what it is, the release it came from, the kernel families and their sources
  records   what a build recorded beside a module: its inputs, its generators, the tests that asked for it
  jit       FlashInfer's JIT as we drive it: module names, the kernel-source mode, the per-module choice, the toolchain
  builds    building modules: smoke's module set, the ninja builds, the build stamp
  preflight the checks of the GPU, driver, toolchain and packages before any compile; standard library
            only when they run too, not just at import (but the NVML probe, which falls back to nvidia-smi)
  smoke     running the workspace's own GPU suites (smoke, abi-smoke) under pytest
  upstream  FlashInfer's own test suite: the plan, the per-file runs, the pytest plugin, the run summary
  affected  from an edit to its modules, their tests and a verdict; in rooms that import in this order:
            selection (which tests), coverage (what they covered), report (what is printed), verdict (the
            enum with each value's exit status, and the rules that decide it); changes, built, tests and
            verdicts (the kept ones) find, build, run and keep
  bindings  the Rust bindings' tools: exported signatures, ELF, module artifacts, Cargo pins, the wheel cache

- A task's first import is fidev.core.task_start (a maintainer tool's, once its sys.path names fidev), so that
  Ctrl-C or SIGTERM while it imports is our line and status 130; tests/test_faults.py holds every task to it.
- A module imports from its own part and from the parts listed before it (PARTS), never after.
- Importing any fidev module needs only the standard library, so preflight can diagnose a
  half-installed environment; a third-party package is imported inside the function that needs it,
  which fails in two lines when it is missing.
tests/test_layout.py holds these rules.
"""

PARTS = ("core", "tree", "records", "jit", "builds", "preflight", "smoke", "upstream", "affected", "bindings")
