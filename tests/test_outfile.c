/* test_outfile.c - output files are written whole or not at all (engine/outfile.h, npy.h):
 *   1. a committed file replaces the previous one and leaves no temporary file;
 *   2. an abandoned file leaves the previous one byte for byte, and no temporary file;
 *   3. a .npy closed short (fewer rows than its shape) fails and leaves the previous file;
 *   4. a path that is not a regular file (/dev/null) is written directly;
 *   5. a path in a missing folder fails with a message naming the path.
 * Contents are fresh random bytes each run; the seed is printed for reproduction. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "npy.h"
#include "outfile.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char dir[256];

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return (size_t)-1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static int entries(void) {   /* files in the test folder, . and .. not counted */
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

int main(void) {
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    srand(seed);
    printf("test_outfile: seed %u\n", seed);
    snprintf(dir, sizeof dir, "/tmp/act_outfile_%ld_XXXXXX", (long)getpid());
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char path[512], err[1400];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    unsigned char a[3000], b[3000], got[4000];
    for (size_t i = 0; i < sizeof a; i++) { a[i] = (unsigned char)rand(); b[i] = (unsigned char)rand(); }

    /* 1. commit: the first file, then its replacement */
    act_outfile o;
    CHECK(act_outfile_open(&o, path, "wb", err, sizeof err) == 0, "open: %s", err);
    fwrite(a, 1, sizeof a, o.fp);
    CHECK(slurp(path, got, sizeof got) == (size_t)-1, "PATH appeared before the commit");
    CHECK(act_outfile_commit(&o, err, sizeof err) == 0, "commit: %s", err);
    CHECK(slurp(path, got, sizeof got) == sizeof a && !memcmp(got, a, sizeof a), "committed bytes differ");
    CHECK(entries() == 1, "%d files after a commit, expected 1", entries());

    /* 2. abandon half way: the first file stays */
    CHECK(act_outfile_open(&o, path, "wb", err, sizeof err) == 0, "open: %s", err);
    fwrite(b, 1, sizeof b / 2, o.fp);
    fflush(o.fp);
    CHECK(entries() == 2, "the temporary file is not a sibling (%d files)", entries());
    act_outfile_abandon(&o);
    CHECK(slurp(path, got, sizeof got) == sizeof a && !memcmp(got, a, sizeof a), "abandon touched PATH");
    CHECK(entries() == 1, "%d files after abandon, expected 1", entries());
    act_outfile_abandon(&o);   /* twice is harmless */

    /* 3. a .npy of 4 rows closed after 3 */
    char npath[512];
    snprintf(npath, sizeof npath, "%s/p.npy", dir);
    float rows[4 * 5];
    for (int i = 0; i < 20; i++) rows[i] = (float)rand() / (float)RAND_MAX + 0.5f;
    int64_t shape[2] = {4, 5};
    CHECK(act_npy_save(npath, rows, shape, 2, err, sizeof err) == 0, "npy save: %s", err);
    size_t before = slurp(npath, got, sizeof got);
    unsigned char keep[4000];
    memcpy(keep, got, before);
    act_npy *f;
    CHECK(act_npy_open(npath, shape, 2, &f, err, sizeof err) == 0, "npy open: %s", err);
    CHECK(act_npy_write(f, rows + 5, 15, err, sizeof err) == 0, "npy write: %s", err);
    CHECK(act_npy_close(f, 0, err, sizeof err) != 0 && strstr(err, "only 15 of 20"), "short close: '%s'", err);
    CHECK(slurp(npath, got, sizeof got) == before && !memcmp(got, keep, before), "short .npy touched PATH");
    CHECK(entries() == 2, "%d files after a short .npy, expected 2", entries());

    /* 4. not a regular file: written in place */
    CHECK(act_outfile_open(&o, "/dev/null", "w", err, sizeof err) == 0 && o.tmp[0] == '\0', "/dev/null: %s", err);
    fputs("x", o.fp);
    CHECK(act_outfile_commit(&o, err, sizeof err) == 0, "/dev/null commit: %s", err);

    /* 5. a missing folder */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/s.json", dir);
    CHECK(act_outfile_open(&o, bad, "w", err, sizeof err) != 0 && strstr(err, bad) && strstr(err, "cannot create"),
          "missing folder: '%s'", err);

    /* 6. finished, then abandoned (a file of a set whose sibling failed): PATH stays */
    CHECK(act_outfile_open(&o, path, "wb", err, sizeof err) == 0, "open: %s", err);
    fwrite(b, 1, sizeof b, o.fp);
    CHECK(act_outfile_finish(&o, err, sizeof err) == 0 && act_outfile_finish(&o, err, sizeof err) == 0,
          "finish (twice): %s", err);
    CHECK(slurp(path, got, sizeof got) == sizeof a && !memcmp(got, a, sizeof a), "finish touched PATH");
    act_outfile_abandon(&o);
    CHECK(slurp(path, got, sizeof got) == sizeof a && !memcmp(got, a, sizeof a), "abandon after finish touched PATH");
    CHECK(entries() == 2, "%d files after finish + abandon, expected 2", entries());
    /* finished, then committed */
    CHECK(act_outfile_open(&o, path, "wb", err, sizeof err) == 0, "open: %s", err);
    fwrite(b, 1, sizeof b, o.fp);
    CHECK(act_outfile_finish(&o, err, sizeof err) == 0 && act_outfile_commit(&o, err, sizeof err) == 0,
          "finish + commit: %s", err);
    CHECK(slurp(path, got, sizeof got) == sizeof b && !memcmp(got, b, sizeof b), "finish + commit: bytes differ");

    /* 7. a write that fails at the flush (/dev/full takes nothing): finish reports it */
    FILE *probe = fopen("/dev/full", "w");
    if (probe) {
        fclose(probe);
        CHECK(act_outfile_open(&o, "/dev/full", "w", err, sizeof err) == 0, "/dev/full: %s", err);
        fwrite(a, 1, 100, o.fp);
        CHECK(act_outfile_finish(&o, err, sizeof err) != 0 && strstr(err, "write failed"), "/dev/full finish: '%s'", err);
        act_outfile_abandon(&o);
    }

    /* 8. act_outfile_remove_pending (a signal handler's): the temporary files of outputs in
     * flight go, committed and abandoned ones are not touched (a slot freed by a commit is no
     * longer a file to remove), and a file opened after still registers */
    act_outfile x, y, z;
    char xp[600], yp[600], zp[600];
    snprintf(xp, sizeof xp, "%s/x.bin", dir);
    snprintf(yp, sizeof yp, "%s/y.bin", dir);
    snprintf(zp, sizeof zp, "%s/z.bin", dir);
    CHECK(act_outfile_open(&x, xp, "wb", err, sizeof err) == 0 && act_outfile_open(&y, yp, "wb", err, sizeof err) == 0,
          "open x, y: %s", err);
    fwrite(a, 1, 10, y.fp);
    CHECK(act_outfile_commit(&y, err, sizeof err) == 0, "commit y: %s", err);
    CHECK(act_outfile_open(&z, zp, "wb", err, sizeof err) == 0, "open z: %s", err);
    CHECK(entries() == 5, "%d files with x, z in flight and y committed, expected 5", entries());
    act_outfile_remove_pending();
    CHECK(entries() == 3 && slurp(yp, got, sizeof got) == 10, "remove_pending: %d files left, expected 3 "
          "(out.bin, p.npy, y.bin)", entries());
    act_outfile_abandon(&x);
    act_outfile_abandon(&z);
    for (int i = 0; i < 70; i++) {   /* more files than slots, one after another: slots are reused */
        act_outfile w;
        CHECK(act_outfile_open(&w, xp, "wb", err, sizeof err) == 0, "open #%d: %s", i, err);
        act_outfile_abandon(&w);
    }
    CHECK(act_outfile_open(&x, xp, "wb", err, sizeof err) == 0, "open x again: %s", err);
    act_outfile_remove_pending();
    CHECK(entries() == 3, "a file opened after 70 others was not removed (%d files, expected 3)", entries());
    act_outfile_abandon(&x);
    remove(yp);

    remove(path);
    remove(npath);
    rmdir(dir);
    if (failures) { fprintf(stderr, "test_outfile: %d failure(s)\n", failures); return 1; }
    printf("test_outfile: all checks passed\n");
    return 0;
}
