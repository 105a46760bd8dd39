"""Live context (spec/001): one thread per agent shared by all requesters, and the agent's handoff."""
