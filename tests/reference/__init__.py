"""Reference implementations the tests compare production code with (never imported by it)."""
