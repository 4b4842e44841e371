/* fuzz_tmp.c - the temporary file behind the path-taking parsers (see fuzz.h). One file per
 * tag and process, rewritten for every input: RAM-backed /dev/shm keeps it cheap, and it is
 * removed at exit so runs leave nothing behind. */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"

#include <string.h>
#include <unistd.h>

#define MAX_TAGS 4

static char g_paths[MAX_TAGS][128];
static int g_registered;

static void remove_all(void)
{
    for (int i = 0; i < MAX_TAGS; i++)
        if (g_paths[i][0]) unlink(g_paths[i]);
}

const char *act_fuzz_tmp_file(const char *tag, const uint8_t *data, size_t size)
{
    int slot = -1;
    for (int i = 0; i < MAX_TAGS && slot < 0; i++)
        if (!g_paths[i][0] || strstr(g_paths[i], tag)) slot = i;
    if (slot < 0) return NULL;
    if (!g_paths[slot][0]) {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(g_paths[slot], sizeof g_paths[slot], "%s/act_fuzz_%ld_%s", dir, (long)getpid(), tag);
        if (!g_registered) {
            atexit(remove_all);
            g_registered = 1;
        }
    }
    FILE *f = fopen(g_paths[slot], "wb");
    if (!f) return NULL;
    size_t put = size ? fwrite(data, 1, size, f) : 0;
    if (fclose(f) != 0 || put != size) return NULL;
    return g_paths[slot];
}
