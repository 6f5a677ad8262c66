"""What a build recorded beside a module: its inputs, its generators, the tests that asked for it."""
