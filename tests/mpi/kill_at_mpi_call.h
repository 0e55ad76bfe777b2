/* kill_in_phase's way into ucm_cache_init's MPI calls: the collectives the
 * library makes are interposed here through MPI's profiling interface (each
 * wrapper calls its PMPI_ twin), counted per name while kill_at_armed is set,
 * and the victim SIGKILLs itself on entering the one it was told:
 *   kill_at_mpi_call_set("MPI_Iallgather", 2)  dies entering the 2nd MPI_Iallgather
 *   kill_at_mpi_call_set(NULL, 0)               prints each call ("mpi-call NAME N")
 * So a kill lands deterministically inside every collective of init, the
 * ones a timer could not hit as well. */
#ifndef UCM_TESTS_MPI_KILL_AT_MPI_CALL_H
#define UCM_TESTS_MPI_KILL_AT_MPI_CALL_H

void kill_at_mpi_call_set(const char* name, int nth);
void kill_at_mpi_call_arm(int rank, int armed);

#endif
