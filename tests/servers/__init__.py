"""Real servers the tests start as local processes on 127.0.0.1 (or as testcontainers where Docker runs)."""
