"""The comparison tools, not part of the library: the seed's code on Accelerate (and the
mapping of Open MPI's variables to torchrun's it needs), the benchmark, its probes and its
sweep. They import accelerate and the other peers only when run."""
