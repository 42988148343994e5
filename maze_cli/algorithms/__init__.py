"""Learners, one per file."""
