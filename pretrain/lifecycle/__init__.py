"""A run's life as the scheduler sees it: signals, the preemption deadline, and the exit codes (exit_status.py holds their one table)."""
