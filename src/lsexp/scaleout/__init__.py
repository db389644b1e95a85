"""Beyond one process: data parallel through msrun (msrun), and sweeps on Ray and Slurm (launchers)."""
