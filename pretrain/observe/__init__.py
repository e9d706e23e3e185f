"""What a run shows: the progress counters, the metrics kept on the device until a drain, the log, TensorBoard and other trackers, the sample audit."""
