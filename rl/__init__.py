"""Learned placers and their shared machinery (features, grouping, trainers)."""
