"""Many machines on Ray: the runner as the driver of one pipeline per node (see docs/cluster.md)."""
