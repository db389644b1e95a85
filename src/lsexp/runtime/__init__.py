"""What a job runs on: the device target, its threads and cores, and oneDNN's instruction-set cap."""
