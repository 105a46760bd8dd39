"""The IPC kernel (ADR-026): packets, zones, the access matrix, agents' gates, the routing table, the channels (who
is speaking: tokens), the router (the only packet path, and its audit record), the sealed inbox and the send socket.
"""
