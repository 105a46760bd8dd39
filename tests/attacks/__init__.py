"""Hostile agents and hostile files, tried the way an attacker would."""
