"""The IPC kernel (ADR-026): packets, zones, the access matrix, agents' gates, the routing table, the router (the only
packet path) and the send socket.
"""
