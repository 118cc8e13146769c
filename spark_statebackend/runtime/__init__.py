"""The runtime: the spool protocol with the JVM shim, the sidecar process and its loops, the committer."""
