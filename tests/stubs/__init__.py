"""Test-only stand-ins for the sidecar (restore answers, a fake process-mode sidecar, a cluster job,
a transformWithState driver)."""
