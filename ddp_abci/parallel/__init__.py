"""How the ranks find each other and act together: launch discovery, the rendezvous, the
process group, the MPI gradient hook, the collectives, stop signals, the stop agreement
and the hung-rank watchdog. Nothing here knows about models or training."""
