"""What the tests stand on but do not test: data files in their real formats, throwaway PostgreSQL and
Slurm clusters, and the transcription of DeepSpeed's loss scaler."""
