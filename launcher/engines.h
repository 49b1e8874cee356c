/* engines.h - running under Slurm, Open MPI or Kubernetes: one mgpu-launch per node, started by
 * srun, mpirun or a pod, takes the number of nodes, its node rank and node 0's address from
 * their variables (SLURM_* / OMPI_COMM_WORLD_* / a PyTorchJob's WORLD_SIZE, RANK, MASTER_ADDR;
 * the PET_* variables of Kubeflow's operators are read as torchrun reads them, cli.h) for
 * every option the user did not give. Explicit options win;
 * cli->derived says what was taken, for --dry-run and the logs. */
#ifndef MGPU_ENGINES_H
#define MGPU_ENGINES_H

#include <stddef.h> /* size_t */

#include "cli.h"   /* mgpu_cli_t */
#include "error.h" /* mgpu_err_t */

/* Fills what the environment of srun or mpirun says into cli (see above). */
int mgpu_engines_apply(mgpu_cli_t *cli, mgpu_getenv_fn getenv_fn, mgpu_err_t *err);

/* Expands a Slurm host list ("gpu[01-03,07],login,r[1-2]n[1-2]") into hosts separated by
 * '\n'; returns how many, or a negative code for a malformed list. out has len bytes. */
int mgpu_hostlist_expand(const char *list, char *out, size_t len, mgpu_err_t *err);

#endif
