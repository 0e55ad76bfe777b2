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

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
  entering("MPI_Comm_dup");
  return PMPI_Comm_dup(comm, out);
}
int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* out, MPI_Request* q) {
  entering("MPI_Comm_idup");
  return PMPI_Comm_idup(comm, out, q);
}
int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* out) {
  entering("MPI_Comm_split_type");
  return PMPI_Comm_split_type(comm, type, key, info, out);
}
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
  entering("MPI_Comm_split");
  return PMPI_Comm_split(comm, color, key, out);
}
int MPI_Barrier(MPI_Comm comm) {
  entering("MPI_Barrier");
  return PMPI_Barrier(comm);
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* q) {
  entering("MPI_Ibarrier");
  return PMPI_Ibarrier(comm, q);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm comm) {
  entering("MPI_Bcast");
  return PMPI_Bcast(b, n, t, root, comm);
}
int MPI_Ibcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request* q) {
  entering("MPI_Ibcast");
  return PMPI_Ibcast(b, n, t, root, comm, q);
}
int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm comm) {
  entering("MPI_Allgather");
  return PMPI_Allgather(s, sn, st, r, rn, rt, comm);
}
int MPI_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm comm,
                   MPI_Request* q) {
  entering("MPI_Iallgather");
  return PMPI_Iallgather(s, sn, st, r, rn, rt, comm, q);
}
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  entering("MPI_Allreduce");
  return PMPI_Allreduce(s, r, n, t, op, comm);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request* q) {
  entering("MPI_Iallreduce");
  return PMPI_Iallreduce(s, r, n, t, op, comm, q);
}
int MPI_Exscan(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  entering("MPI_Exscan");
  return PMPI_Exscan(s, r, n, t, op, comm);
}
int MPI_Iexscan(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm, MPI_Request* q) {
  entering("MPI_Iexscan");
  return PMPI_Iexscan(s, r, n, t, op, comm, q);
}
