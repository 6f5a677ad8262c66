"""Running the workspace's own GPU suites (smoke, abi-smoke) under pytest."""
