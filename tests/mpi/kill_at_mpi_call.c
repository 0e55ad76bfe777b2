/* See kill_at_mpi_call.h. */
#include "kill_at_mpi_call.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char* target = NULL; /* NULL: trace */
static int target_nth = 0;
static int armed = 0, my_rank = -1;
static const char* names[16];
static int counts[16];

void kill_at_mpi_call_set(const char* name, int nth) {
  target = name;
  target_nth = nth;
}

void kill_at_mpi_call_arm(int rank, int on) {
  my_rank = rank;
  armed = on;
}

/* Called on entering each interposed call (only the app's thread calls MPI in init). */
static void entering(const char* name) {
  if (!armed) return;
  int i = 0;
  while (i < 16 && names[i] && strcmp(names[i], name) != 0) ++i;
  if (i == 16) return;
  names[i] = name;
  const int n = ++counts[i];
  if (!target) {
    printf("rank %d: mpi-call %s %d\n", my_rank, name, n);
    fflush(stdout);
  } else if (strcmp(target, name) == 0 && n == target_nth) {
    kill(getpid(), SIGKILL);
  }
}

/* NAME(PARAMS) enters, then calls PMPI_NAME(ARGS). */
#define WRAP(name, params, args) \
  int MPI_##name params {        \
    entering("MPI_" #name);      \
    return PMPI_##name args;     \
  }

typedef MPI_Datatype T;
typedef MPI_Request* Q;
WRAP(Comm_dup, (MPI_Comm c, MPI_Comm* o), (c, o))
WRAP(Comm_idup, (MPI_Comm c, MPI_Comm* o, Q q), (c, o, q))
WRAP(Comm_split_type, (MPI_Comm c, int t, int k, MPI_Info i, MPI_Comm* o), (c, t, k, i, o))
WRAP(Comm_split, (MPI_Comm c, int color, int k, MPI_Comm* o), (c, color, k, o))
WRAP(Barrier, (MPI_Comm c), (c))
WRAP(Ibarrier, (MPI_Comm c, Q q), (c, q))
WRAP(Bcast, (void* b, int n, T t, int root, MPI_Comm c), (b, n, t, root, c))
WRAP(Ibcast, (void* b, int n, T t, int root, MPI_Comm c, Q q), (b, n, t, root, c, q))
WRAP(Allgather, (const void* s, int sn, T st, void* r, int rn, T rt, MPI_Comm c), (s, sn, st, r, rn, rt, c))
WRAP(Iallgather, (const void* s, int sn, T st, void* r, int rn, T rt, MPI_Comm c, Q q), (s, sn, st, r, rn, rt, c, q))
WRAP(Allreduce, (const void* s, void* r, int n, T t, MPI_Op op, MPI_Comm c), (s, r, n, t, op, c))
WRAP(Iallreduce, (const void* s, void* r, int n, T t, MPI_Op op, MPI_Comm c, Q q), (s, r, n, t, op, c, q))
WRAP(Exscan, (const void* s, void* r, int n, T t, MPI_Op op, MPI_Comm c), (s, r, n, t, op, c))
WRAP(Iexscan, (const void* s, void* r, int n, T t, MPI_Op op, MPI_Comm c, Q q), (s, r, n, t, op, c, q))
