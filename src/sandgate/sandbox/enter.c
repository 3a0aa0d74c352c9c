/* sandgate-enter: the steps between the runner and bwrap, in one small program (enter.py).
 *
 *   sandgate-enter ERRFD NETNS UID GID OOM|- [CGROUP_PROCS...] -- BWRAP ARGS...
 *   sandgate-enter ERRFD NETNS UID GID OOM|- [CGROUP_PROCS...] -- @ ARGVFD
 *   sandgate-enter ERRFD @ UID GID OOM|- [CGROUP_PROCS...] -- @ ARGVFD
 *
 * The second form does every step, then reads the command line from ARGVFD (NUL-separated,
 * to end-of-file): started before the command line is known, its waits (a cgroup v1 join
 * waits out an RCU grace period) overlap the runner's. End-of-file with nothing read (the
 * runner gave up, or died) exits 125 and runs nothing. With NETNS "@" the namespace's path is
 * the command line's first string: started before the runner has the namespace, the join
 * (the slow step) begins sooner; the line is then read before the setns, still as root.
 *
 * In this order, as the old chain did them (sh, nsenter, setpriv): the OOM score; "0" into
 * each cgroup.procs (the writer joins); setns into NETNS; every capability out of the
 * bounding set and the inheritable set cleared (needs CAP_SETPCAP: before the uid switch);
 * setgroups(0), setresgid, setresuid (leaving uid 0 clears permitted, effective and ambient);
 * no_new_privs; exec BWRAP. A failing step writes its name to ERRFD and exits 125; ERRFD is
 * close-on-exec, so the runner reads either that or end-of-file once bwrap runs.
 *
 * It exists because the runner cannot do these steps in a vfork()ed child, and a full fork of
 * a Python process costs 6 ms at 100 MB and 17-22 ms at 300 MB (2026-12-01, this machine),
 * where vfork + exec of this program is under 1 ms whatever the runner's size.
 *
 *   sandgate-enter --late BLOBFD SELFFD
 *
 * The third form runs inside the sandbox, as the command bwrap execs (through
 * /proc/self/fd/SELFFD, so nothing of it is bound into the sandbox): bwrap is set up before
 * the command's environment is known (the gateway's answer gives it), and this waits for it.
 * It reads from BLOBFD, to end-of-file, the environment (NAME=VALUE, NUL-separated), an empty
 * string, then the command line; then execs the command with exactly that environment, both
 * descriptors closed. End-of-file with nothing read (the runner gave up, or died) exits 125
 * and runs nothing: the read is the sandbox's hold, as bwrap's --block-fd was. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int errfd = -1;

static void fail(const char *step, int err) {
    char msg[256];
    int n = snprintf(msg, sizeof msg, "%s: %s", step, strerror(err));
    if (errfd >= 0 && n > 0 && write(errfd, msg, (size_t)n) < 0) {
        /* nothing more to say: the exit status still tells the runner */
    }
    _exit(125);
}

static long number(const char *text, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *text == '\0' || *end != '\0') fail(what, EINVAL);
    return v;
}

static void fail_at(const char *step, const char *path, int err) {
    char what[256];
    snprintf(what, sizeof what, "%s (%s)", step, path);
    fail(what, err);
}

static void write_file(const char *path, const char *text, const char *step) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) fail_at(step, path, errno);
    close(fd);
}

/* The command line from fd, NUL-separated, read to its end; NULL when nothing came. */
static char **read_argv(int fd) {
    size_t size = 0, cap = 4096;
    char *buf = malloc(cap);
    if (buf == NULL) fail("reading the command line", ENOMEM);
    for (;;) {
        if (size == cap && (buf = realloc(buf, cap *= 2)) == NULL)
            fail("reading the command line", ENOMEM);
        ssize_t n = read(fd, buf + size, cap - size);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("reading the command line", errno);
        if (n == 0) break;
        size += (size_t)n;
    }
    close(fd);
    if (size == 0) return NULL;
    if (buf[size - 1] != '\0') fail("reading the command line (not NUL-terminated)", EINVAL);
    size_t count = 0;
    for (size_t i = 0; i < size; i++) count += buf[i] == '\0';
    char **out = calloc(count + 1, sizeof *out);
    if (out == NULL) fail("reading the command line", ENOMEM);
    for (size_t i = 0, k = 0; i < size; k++) {
        out[k] = buf + i;
        i += strlen(buf + i) + 1;
    }
    return out;
}

/* Inside the sandbox: wait for the environment and command line, then exec the command. */
static int late(const char *blob, const char *self) {
    int self_fd = (int)number(self, "own descriptor");
    if (fcntl(self_fd, F_SETFD, FD_CLOEXEC) < 0) fail("own descriptor", errno);
    char **entries = read_argv((int)number(blob, "command line descriptor"));
    if (entries == NULL) _exit(125); /* given up before the command: run nothing */
    char **command = entries;
    while (*command != NULL && **command != '\0') command++;
    if (*command == NULL || command[1] == NULL) {
        fprintf(stderr, "sandgate: no command after the environment\n");
        _exit(125);
    }
    *command++ = NULL; /* entries: the environment, as environ wants it */
    environ = entries;
    execvp(command[0], command); /* PATH from that environment, as bwrap's execvp did */
    fprintf(stderr, "sandgate: cannot run %s: %s\n", command[0], strerror(errno));
    _exit(127);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--late") == 0) return late(argv[2], argv[3]);
    if (argc < 8) {
        fprintf(stderr, "usage: sandgate-enter ERRFD NETNS UID GID OOM|- [PROCS...] -- CMD...\n");
        return 125;
    }
    errfd = (int)number(argv[1], "error descriptor");
    if (fcntl(errfd, F_SETFD, FD_CLOEXEC) < 0) {
        errfd = -1;
        fail("error descriptor", errno);
    }
    const char *netns = argv[2];
    long uid = number(argv[3], "uid"), gid = number(argv[4], "gid");
    if (uid <= 0 || gid <= 0) fail("a sandbox never runs as uid or gid 0", EINVAL);
    if (strcmp(argv[5], "-") != 0) {
        number(argv[5], "OOM score");
        write_file("/proc/self/oom_score_adj", argv[5], "setting the OOM score");
    }
    int i = 6;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++)
        write_file(argv[i], "0", "joining the session's cgroup");
    if (i + 1 >= argc) fail("no command after --", EINVAL);
    char **command = argv + i + 1;
    int later = strcmp(command[0], "@") == 0 && command[1] != NULL && command[2] == NULL;
    if (strcmp(netns, "@") == 0) { /* the namespace is the command line's first string */
        if (!later) fail("a namespace given later needs the command line later", EINVAL);
        command = read_argv((int)number(command[1], "command line descriptor"));
        if (command == NULL) _exit(125); /* given up before the command line: run nothing */
        if (command[1] == NULL) fail("no command after the namespace", EINVAL);
        netns = *command++;
        later = 0;
    }

    int ns = open(netns, O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail_at("opening the guest's network namespace", netns, errno);
    if (setns(ns, CLONE_NEWNET) < 0) fail_at("entering the guest's network namespace", netns, errno);
    close(ns);

    for (int cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
            if (errno == EINVAL) break; /* past the kernel's last capability */
            fail("dropping the capability bounding set", errno);
        }
    }
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &header, data) < 0) fail("reading capabilities", errno);
    data[0].inheritable = data[1].inheritable = 0;
    if (syscall(SYS_capset, &header, data) < 0) fail("clearing inheritable capabilities", errno);

    if (setgroups(0, NULL) < 0) fail("clearing supplementary groups", errno);
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0) fail("switching gid", errno);
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0) fail("switching uid", errno);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail("setting no_new_privs", errno);

    if (later) {
        command = read_argv((int)number(command[1], "command line descriptor"));
        if (command == NULL) _exit(125); /* given up before the command line: run nothing */
    }
    execvp(command[0], command); /* PATH as setpriv searched it: the runner's */
    fail("starting bwrap", errno);
    return 125;
}
