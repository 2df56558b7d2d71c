/*
 * Linked into every harness. A decoder logs each input it rejects, which
 * would drown the fuzzer's own output and slow it down many times over, so
 * logging is off while fuzzing.
 */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    graft_log_level_set(GRAFT_LOG_OFF);
    return 0;
}
