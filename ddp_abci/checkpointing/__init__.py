"""Checkpoints: the file and its keys (checkpoint.py), what a run saves and when
(manager.py, save_points.py), and what a resume restores and checks (resume.py)."""
