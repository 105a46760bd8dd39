"""Tests of ambient.learning: statistics, learned rules, the rule store, replay."""
