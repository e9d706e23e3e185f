"""Checkpoints: which one a launch resumes, the checkpoint manager over the run's stateful parts, the folders, their integrity and their copy in object storage."""
