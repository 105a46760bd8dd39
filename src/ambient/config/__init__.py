"""Configuration: ambient's settings, a brain loaded into one read-only snapshot, and what ``ambient init`` writes."""
