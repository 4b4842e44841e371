/* episode_list.c - turns command-line arguments into an ordered list of episode files.
 * A directory contributes its episode_<N>.hdf5 files sorted by the NUMBER N (episode_2 before
 * episode_10, which a plain name sort gets wrong); files named on the command line are taken as
 * they are, in the order given, so a user can pick any subset or order. */
#include "episode.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct { char *path; long long num; const char *name; } entry;

static int parse_episode_number(const char *name, long long *num) {
    const char *pre = "episode_", *suf = ".hdf5";
    size_t n = strlen(name), lp = strlen(pre), ls = strlen(suf);
    if (n <= lp + ls || strncmp(name, pre, lp) != 0 || strcmp(name + n - ls, suf) != 0) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(name + lp, &end, 10);
    *num = (end == name + n - ls && end != name + lp && errno == 0) ? v : -1;
    return 0;
}

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    /* numbered files first, by number; oddly named episode_*.hdf5 after, by name */
    if ((x->num < 0) != (y->num < 0)) return x->num < 0 ? 1 : -1;
    if (x->num != y->num) return x->num < y->num ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int push(char ***paths, int *n, int *cap, char *p) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        char **np = realloc(*paths, sizeof(char *) * (size_t)nc);
        if (!np) return -1;
        *paths = np;
        *cap = nc;
    }
    (*paths)[(*n)++] = p;
    return 0;
}

static int list_dir(const char *dir, char ***paths, int *n, int *cap, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno));
        return -1;
    }
    entry *es = NULL;
    int ne = 0, ce = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        long long num;
        if (parse_episode_number(de->d_name, &num) != 0) continue;
        if (ne == ce) {
            ce = ce ? ce * 2 : 64;
            entry *ne2 = realloc(es, sizeof(entry) * (size_t)ce);
            if (!ne2) { rc = -1; break; }
            es = ne2;
        }
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(len);
        if (!p) { rc = -1; break; }
        snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", de->d_name);
        es[ne].path = p;
        es[ne].num = num;
        es[ne].name = act_episode_basename(p);
        ne++;
    }
    closedir(d);
    if (rc == 0 && ne == 0) {
        snprintf(err, errlen, "%s: no episode_*.hdf5 files in this directory", dir);
        rc = -1;
    } else if (rc != 0) {
        snprintf(err, errlen, "%s: out of memory listing episodes", dir);
    }
    if (rc == 0) {
        qsort(es, (size_t)ne, sizeof(entry), cmp_entry);
        for (int i = 0; i < ne; i++) {
            if (push(paths, n, cap, es[i].path) != 0) {
                snprintf(err, errlen, "%s: out of memory listing episodes", dir);
                for (int j = i; j < ne; j++) free(es[j].path);
                free(es);
                return -1;
            }
        }
    } else {
        for (int i = 0; i < ne; i++) free(es[i].path);
    }
    free(es);
    return rc;
}

int act_episode_list(char *const *args, int nargs, char ***paths, int *npaths,
                     char *err, size_t errlen) {
    *paths = NULL;
    *npaths = 0;
    int cap = 0;
    for (int i = 0; i < nargs; i++) {
        struct stat st;
        if (stat(args[i], &st) != 0) {
            snprintf(err, errlen, "%s: %s", args[i], strerror(errno));
            goto fail;
        }
        if (S_ISDIR(st.st_mode)) {
            if (list_dir(args[i], paths, npaths, &cap, err, errlen) != 0) goto fail;
        } else {
            char *p = strdup(args[i]);
            if (!p || push(paths, npaths, &cap, p) != 0) {
                free(p);
                snprintf(err, errlen, "out of memory listing episodes");
                goto fail;
            }
        }
    }
    if (*npaths == 0) {
        snprintf(err, errlen, "no episodes given");
        goto fail;
    }
    return 0;
fail:
    act_episode_free_list(*paths, *npaths);
    *paths = NULL;
    *npaths = 0;
    return -1;
}

void act_episode_free_list(char **paths, int npaths) {
    for (int i = 0; i < npaths; i++) free(paths[i]);
    free(paths);
}

const char *act_episode_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

long long act_episode_number(const char *path) {
    long long num;
    return parse_episode_number(act_episode_basename(path), &num) == 0 ? num : -1;
}

void act_episode_stem(const char *path, char *buf, size_t buflen) {
    snprintf(buf, buflen, "%s", act_episode_basename(path));
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf) *dot = '\0';
}
