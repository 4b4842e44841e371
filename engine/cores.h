/* cores.h - how many CPUs this process may use (cores.c): the online CPUs, its affinity mask and
 * its cgroup CPU quota, the smallest of which sets the engine's default thread counts. */
#ifndef ACT_CORES_H
#define ACT_CORES_H

typedef struct act_cores {
    int online;     /* sysconf(_SC_NPROCESSORS_ONLN), at least 1 */
    int affinity;   /* CPUs in the process's (main thread's) affinity mask (taskset, cpusets); 0 when unreadable */
    double quota;   /* CPUs the cgroup quota allows, e.g. 1.5; 0 when none is set */
    int usable;     /* the smallest of the three (the quota rounded up), at least 1 */
} act_cores;

void act_cores_read(act_cores *c);

/* The CPUs a cgroup CPU limit allows this process (cores.c says where it looks), reading
 * cgroup_root ("/sys/fs/cgroup") and proc_cgroup ("/proc/self/cgroup"); 0 when none is set or
 * nothing can be read. Takes the paths so tests can hand it a made-up tree. */
double act_cores_quota(const char *cgroup_root, const char *proc_cgroup);

#endif
