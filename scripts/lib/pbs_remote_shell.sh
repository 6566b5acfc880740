#!/bin/sh
# mpirun's remote shell under PBS where nodes have no ssh between them: PBS's own pbs_tmrsh
# starts the command on the sister node through its MOM, as a task of the job (PBS counts it
# and ends it with the job). Open MPI passes its agent the host and one shell command line,
# which pbs_tmrsh would run as a program's name: here a shell reads it.
#   MPI_ARGS="--prtemca plm_ssh_agent $REPO/scripts/lib/pbs_remote_shell.sh"   (Open MPI 5)
#   MPI_ARGS="--mca plm_rsh_agent $REPO/scripts/lib/pbs_remote_shell.sh"       (Open MPI 4, HPC-X)
host=$1
shift
exec "${PBS_EXEC:-/opt/pbs}/bin/pbs_tmrsh" "$host" /bin/sh -c "$*"
