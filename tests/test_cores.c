/* test_cores.c - the CPUs the engine's default thread counts follow (engine/cores.c): cgroup v2
 * and v1 CPU limits read from made-up trees (the tightest on the way up, a cgroup path that
 * does not exist in a container's view, unreadable or malformed files ignored), and the counts
 * this process reads. No model needed. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/types.h>
#include "cores.h"
#include "test_common.h"

static char g_root[] = "/tmp/act_test_coresXXXXXX";
static char g_made[64][512];
static int g_nmade;

/* root/rel written with text (its folders made) */
static void put(const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    for (char *p = path + strlen(g_root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0700) == 0 && g_nmade < 64) snprintf(g_made[g_nmade++], sizeof g_made[0], "%s", path);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    if (g_nmade < 64) snprintf(g_made[g_nmade++], sizeof g_made[0], "%s", path);
}

/* every file and folder put() made, deepest first (folders were recorded before their files) */
static void clear(void) {
    for (int i = g_nmade - 1; i >= 0; i--)
        if (remove(g_made[i]) != 0 && errno != ENOENT) fprintf(stderr, "cannot remove %s\n", g_made[i]);
    g_nmade = 0;
}

static double quota(void) {
    char proc[600];
    snprintf(proc, sizeof proc, "%s/proc_cgroup", g_root);
    return act_cores_quota(g_root, proc);
}

static void expect(const char *what, double want) {
    double got = quota();
    CHECK(fabs(got - want) < 1e-9, "%s: quota %g, want %g", what, got, want);
    clear();
}

/* pins the calling thread to its first allowed CPU, then reads the cores into arg */
static void *pinned_read(void *arg) {
    cpu_set_t set, one;
    CPU_ZERO(&set);
    CPU_ZERO(&one);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int i = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &set)) {
                CPU_SET(i, &one);
                break;
            }
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    act_cores_read(arg);
    return NULL;
}

int main(void) {
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    /* cgroup v2 */
    put("proc_cgroup", "0::/a/b\n");
    put("a/b/cpu.max", "max 100000\n");
    put("a/cpu.max", "150000 100000\n");
    expect("v2: the leaf unlimited, its parent 1.5 CPUs", 1.5);

    put("proc_cgroup", "0::/a/b\n");
    put("a/b/cpu.max", "200000 100000\n");
    put("a/cpu.max", "100000 100000\n");
    put("cpu.max", "400000 100000\n");
    expect("v2: the tightest of leaf, parent and root", 1.0);

    put("proc_cgroup", "0::/kubepods/pod1/c1\n");
    put("cpu.max", "300000 100000\n");
    expect("v2: a path that is not in this view, the root's own limit", 3.0);

    put("proc_cgroup", "0::/\n");
    put("cpu.max", "max 100000\n");
    expect("v2: no limit", 0);

    put("proc_cgroup", "0::/x\n");
    put("x/cpu.max", "abc 100000\n");
    expect("v2: a malformed cpu.max is ignored", 0);
    put("proc_cgroup", "0::/x\n");
    put("x/cpu.max", "150000\n");
    expect("v2: a cpu.max of one field is ignored", 0);
    put("proc_cgroup", "0::/x\n");
    put("x/cpu.max", "150000 0\n");
    expect("v2: a period of 0 is ignored", 0);

    /* cgroup v1 (and the hybrid layout, whose 0:: line has no cpu controller) */
    put("proc_cgroup", "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n0::/\n");
    put("cpu,cpuacct/docker/x/cpu.cfs_quota_us", "250000\n");
    put("cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
    expect("v1: cpu,cpuacct mount, 2.5 CPUs", 2.5);

    put("proc_cgroup", "1:cpu:/docker/abc\n");
    put("cpu/cpu.cfs_quota_us", "200000\n");
    put("cpu/cpu.cfs_period_us", "100000\n");
    expect("v1: the host's path inside a container's view, the mount's root limit", 2.0);

    put("proc_cgroup", "4:cpu,cpuacct:/\n");
    put("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    expect("v1: a quota of -1 is none", 0);

    put("proc_cgroup", "2:cpuacct:/a\n1:cpuset:/a\n");
    put("cpuacct/a/cpu.cfs_quota_us", "100000\n");
    put("cpuacct/a/cpu.cfs_period_us", "100000\n");
    expect("v1: a controller list without cpu is not the cpu controller", 0);

    put("proc_cgroup", "4:cpu,cpuacct:/\n0::/\n");
    put("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    put("cpu.max", "50000 100000\n");
    expect("a v1 cpu line without a quota, then the v2 root's limit", 0.5);

    {   /* a line longer than any path (a damaged or made-up file) is skipped whole, its tail too */
        char *big = malloc(20000);
        memset(big, 'a', 19999);
        big[0] = '0', big[1] = ':', big[2] = ':', big[3] = '/';
        big[19999] = 0;
        char text[20100];
        snprintf(text, sizeof text, "%s\n0::/ok\n", big);
        free(big);
        put("proc_cgroup", text);
        put("ok/cpu.max", "200000 100000\n");
        expect("an over-long line skipped, the next one read", 2.0);
    }

    char proc[600];
    snprintf(proc, sizeof proc, "%s/no_such_file", g_root);
    CHECK(act_cores_quota(g_root, proc) == 0, "no /proc/self/cgroup: no quota");
    CHECK(act_cores_quota("/nonexistent_act_root", "/proc/self/cgroup") == 0, "no cgroup tree: no quota");
    rmdir(g_root);

    /* this process: usable is at least 1 and no more than any of the three */
    act_cores c;
    act_cores_read(&c);
    cpu_set_t set;
    CPU_ZERO(&set);
    int aff = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    printf("this process: %d online, affinity %d, quota %g, usable %d\n", c.online, c.affinity, c.quota, c.usable);
    CHECK(c.online >= 1 && c.usable >= 1 && c.usable <= c.online, "usable %d of %d online", c.usable, c.online);
    CHECK(c.affinity == aff && (aff == 0 || c.usable <= aff), "affinity %d (sched_getaffinity %d), usable %d",
          c.affinity, aff, c.usable);
    CHECK(c.quota <= 0 || c.usable <= (int)ceil(c.quota) || c.usable == 1, "usable %d over a quota of %g",
          c.usable, c.quota);
    if (aff > 1) {   /* a thread pinned to one CPU still reads the process's mask */
        pthread_t t;
        act_cores tc = {0};
        CHECK(pthread_create(&t, NULL, pinned_read, &tc) == 0, "pthread_create");
        pthread_join(t, NULL);
        CHECK(tc.affinity == aff, "a thread pinned to one CPU read affinity %d, the process has %d",
              tc.affinity, aff);
    }
    if (aff > 1) {   /* the process pinned to one CPU, a fresh read says 1 usable */
        cpu_set_t one;
        CPU_ZERO(&one);
        for (int i = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &set)) {
                CPU_SET(i, &one);
                break;
            }
        if (sched_setaffinity(0, sizeof one, &one) == 0) {
            act_cores_read(&c);
            CHECK(c.affinity == 1 && c.usable == 1, "pinned to one CPU: affinity %d, usable %d", c.affinity,
                  c.usable);
            sched_setaffinity(0, sizeof set, &set);
        }
    }
    printf("test_cores: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
