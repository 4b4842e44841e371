/* cores.c - how many CPUs this process may use (interface: cores.h).
 * defines: act_cores_quota, act_cores_read
 *
 * The default thread counts (the CPU backend's pool, act_run's copy threads, the episode
 * reader's inflate threads, act-serve's I/O threads) follow the cores. The online count alone
 * overcounts where the process is held to fewer: an affinity mask (taskset, a cpuset,
 * `docker --cpuset-cpus`) or a cgroup CPU quota (`docker --cpus=2`, a Kubernetes CPU limit). A
 * pool of 64 spinning helpers under a 2-CPU quota would spend most of each period throttled, so
 * the usable count is the smallest of the three; a quota of 1.5 CPUs counts as 2.
 *
 * The quota: cgroup v2's cpu.max ("max PERIOD" or "QUOTA PERIOD") of the process's cgroup and
 * of every cgroup above it (a parent's limit holds its children too), else cgroup v1's
 * cpu.cfs_quota_us / cpu.cfs_period_us (-1: none) the same way under the cpu controller's
 * mount. Inside a container the cgroup path /proc/self/cgroup names may not exist under the
 * container's /sys/fs/cgroup (v1 without a cgroup namespace shows the host's path): the walk up
 * from it ends at the mount's root, which is then the container's own cgroup. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cores.h"

/* the first line of file path into buf; 0 when it cannot be read */
static int first_line(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* a whole non-negative decimal number (or -1 for "-1"); 0 when the text is anything else */
static int parse_long(const char *s, long *out) {
    char *end = NULL;
    if (!s || !*s || (*s != '-' && (*s < '0' || *s > '9'))) return 0;
    long v = strtol(s, &end, 10);
    if (*end || v < -1) return 0;
    *out = v;
    return 1;
}

/* CPUs allowed by one cgroup directory's limit; 0 when it sets none (or none is readable) */
static double dir_quota(const char *dir, int v2) {
    char path[PATH_MAX + 32], line[128], a[64] = "", b[64] = "";
    long quota = -1, period = 0;
    if (v2) {
        snprintf(path, sizeof path, "%s/cpu.max", dir);
        if (!first_line(path, line, sizeof line) || sscanf(line, "%63s %63s", a, b) != 2) return 0;
        if (!strcmp(a, "max") || !parse_long(a, &quota) || !parse_long(b, &period)) return 0;
    } else {
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (!first_line(path, line, sizeof line) || !parse_long(line, &quota)) return 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (!first_line(path, line, sizeof line) || !parse_long(line, &period)) return 0;
    }
    return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

/* the tightest limit from dir mount + cg up to mount; 0: none */
static double walk_up(const char *mount, const char *cg, int v2) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s%s", mount, cg) >= (int)sizeof dir) return 0;
    size_t root = strlen(mount);
    while (strlen(dir) > root && dir[strlen(dir) - 1] == '/') dir[strlen(dir) - 1] = 0;
    double best = 0;
    for (;;) {
        double q = dir_quota(dir, v2);
        if (q > 0 && (best == 0 || q < best)) best = q;
        if (strlen(dir) <= root) break;
        char *slash = strrchr(dir + root, '/');
        if (!slash) dir[root] = 0;
        else *slash = 0;
    }
    return best;
}

double act_cores_quota(const char *cgroup_root, const char *proc_cgroup) {
    FILE *f = fopen(proc_cgroup, "r");
    if (!f) return 0;
    char line[PATH_MAX + 256], v2_path[PATH_MAX] = "", v1_path[PATH_MAX] = "";
    int have_v2 = 0, have_v1 = 0;
    while (fgets(line, sizeof line, f)) {   /* "ID:CONTROLLERS:PATH" */
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') {   /* longer than any path: skip the rest of it */
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n') {}
            continue;
        }
        line[len - 1] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/') continue;
        *c1 = *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        if (strlen(path) >= sizeof v2_path) continue;   /* never the name cut short */
        if (!strcmp(line, "0") && !*ctrl) {
            snprintf(v2_path, sizeof v2_path, "%s", path);
            have_v2 = 1;
            continue;
        }
        char list[256];   /* "cpu,cpuacct": is "cpu" one of the controllers */
        snprintf(list, sizeof list, ",%s,", ctrl);
        if (strstr(list, ",cpu,")) {
            snprintf(v1_path, sizeof v1_path, "%s", path);
            have_v1 = 1;
        }
    }
    fclose(f);
    char mount[PATH_MAX];
    if (have_v1) {   /* where the cpu controller is mounted, by the usual names */
        static const char *const names[] = {"cpu,cpuacct", "cpu", "cpuacct,cpu"};
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            snprintf(mount, sizeof mount, "%s/%s", cgroup_root, names[i]);
            double q = walk_up(mount, v1_path, 0);
            if (q > 0) return q;
        }
    }
    if (have_v2) return walk_up(cgroup_root, v2_path, 1);
    return 0;
}

/* CPUs in the main thread's affinity mask (getpid(): the process's, not the calling thread's,
 * which a program may have pinned to one core before it makes a session); the set grows for
 * kernels built for more than 1024 CPUs. 0 when it cannot be read. */
static int process_affinity(void) {
    for (int n = 1024; n <= (1 << 16); n *= 2) {
        cpu_set_t *set = CPU_ALLOC(n);
        if (!set) return 0;
        size_t size = CPU_ALLOC_SIZE(n);
        CPU_ZERO_S(size, set);
        int rc = sched_getaffinity(getpid(), size, set), err = errno, count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (rc == 0) return count;
        if (err != EINVAL) return 0;
    }
    return 0;
}

void act_cores_read(act_cores *c) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    c->online = online < 1 ? 1 : online > 4096 ? 4096 : (int)online;
    c->affinity = process_affinity();
    c->quota = act_cores_quota("/sys/fs/cgroup", "/proc/self/cgroup");
    int n = c->online;
    if (c->affinity > 0 && c->affinity < n) n = c->affinity;
    if (c->quota > 0 && c->quota < n) {   /* rounded up: 1.5 CPUs keep 2 threads busy */
        int up = (int)c->quota;
        if (c->quota - up > 1e-9 || up < 1) up++;
        if (up < n) n = up;
    }
    c->usable = n;
}
