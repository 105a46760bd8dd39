"""Agents run on worker hosts through NATS JetStream (docs/cluster.md): what the daemon and its workers say to each
other and the rules of an attempt's lease (`protocol`, *pure*), the connection and the JetStream objects (`link`), the
daemon's side that publishes a dispatched SPAWN and awaits its result (`dispatch`), and the worker's side that runs it
under a lease with the command runner (`worker`). `nats` (the `cluster` extra) is imported only inside functions.
"""
