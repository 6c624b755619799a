/* A "backend" an attacker would upload: its constructor runs as soon as
 * the library is mapped (before any TRITONBACKEND_* symbol is looked up)
 * and leaves a marker file, so a test can tell whether it ever ran. It
 * defines no TRITONBACKEND_ModelInstanceExecute on purpose: the load
 * fails afterwards, too late. MARKER is the marker's path, given with
 * -DMARKER="\"...\"" at compile time. */
#include <stdio.h>

#ifndef MARKER
#error "compile with -DMARKER=\"\\\"<path>\\\"\""
#endif

__attribute__((constructor)) static void planted(void)
{
    FILE *f = fopen(MARKER, "w");
    if (f) {
        fputs("uploaded code ran in the server\n", f);
        fclose(f);
    }
}
