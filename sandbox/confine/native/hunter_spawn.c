/*
 * sandbox._spawn: the kernel-enforced launcher for sandboxed process turns.
 *
 * One function, spawn(), starts a child with clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)
 * (the way posix_spawn does it, so no copy of the Python process is made) and, in the
 * child, before execve:
 *   signal dispositions reset, setsid, setns(network namespace), join the turn's cgroups,
 *   rlimits, setgroups([]) + setresgid + setresuid (unprivileged uid), PR_SET_NO_NEW_PRIVS,
 *   landlock_restrict_self(ruleset), stdin/stdout/stderr, the seccomp filter (its user
 *   notification listener fd sent to the parent over a socket), close every other fd, execve.
 * With newpid the child is also the first process (PID 1) of a new PID namespace
 * (CLONE_NEWPID): when it exits, the kernel kills and reaps everything it left behind.
 *
 * The child shares the parent's memory until execve, so it only makes raw system calls
 * (no malloc, no stdio, no glibc set*id wrappers: those signal every thread of the
 * parent). A failing step stores (stage, errno) in a struct the parent reads after clone
 * returns; the child then exits with 127 and the parent reaps it and raises OSError.
 * The Landlock ruleset is built by the parent (sandbox/landlock.py); the child only
 * restricts itself with it.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_seccomp
#define SYS_seccomp 317
#endif
#ifndef CLONE_NEWPID
#define CLONE_NEWPID 0x20000000
#endif
#define HS_SECCOMP_SET_MODE_FILTER 1
#define HS_SECCOMP_FILTER_FLAG_NEW_LISTENER (1UL << 3)

/* struct sock_fprog without including linux/filter.h */
struct hs_fprog {
    unsigned short len;
    const void *filter;
};

#define STACK_SIZE (256 * 1024)
#define MAX_CGROUPS 8
#define MAX_RLIMITS 16

enum stage {
    ST_NONE = 0,
    ST_SIGNALS,
    ST_SETSID,
    ST_SETNS,
    ST_CGROUP,
    ST_RLIMIT,
    ST_SETGROUPS,
    ST_SETGID,
    ST_SETUID,
    ST_NO_NEW_PRIVS,
    ST_LANDLOCK,
    ST_STDIO,
    ST_SECCOMP,
    ST_NOTIFY_SEND,
    ST_CLOSE_FDS,
    ST_CHDIR,
    ST_EXEC,
};

static const char *stage_names[] = {
    "none", "signals", "setsid", "setns", "cgroup", "rlimit", "setgroups",
    "setgid", "setuid", "no_new_privs", "landlock", "stdio", "seccomp", "notify_send",
    "close_fds", "chdir", "execve",
};

struct rlim_spec {
    int resource;
    struct rlimit limit;
};

struct child_args {
    const char *path;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int stdio[3];
    int cgroup_fds[MAX_CGROUPS];
    int n_cgroups;
    struct rlim_spec rlimits[MAX_RLIMITS];
    int n_rlimits;
    long uid;
    long gid;
    int netns_fd;
    int landlock_fd;
    int landlock_flags; /* landlock_restrict_self flags (audit logging, ABI >= 7) */
    const void *seccomp_prog; /* struct sock_filter[], NULL for none */
    unsigned short seccomp_len;
    int notify_sock; /* where the listener fd is sent, -1: no listener */
    /* written by the child on failure, read by the parent after clone returns */
    volatile int err_stage;
    volatile int err_errno;
};

static int fail(struct child_args *a, int stage, int err) {
    a->err_stage = stage;
    a->err_errno = err;
    syscall(SYS_exit_group, 127);
    return 127;
}

static size_t fmt_pid(char *buf, long v) {
    char tmp[24];
    size_t n = 0, i;
    if (v == 0) tmp[n++] = '0';
    while (v > 0) {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    }
    for (i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    buf[n] = '\n';
    return n + 1;
}

static int child_main(void *arg) {
    struct child_args *a = (struct child_args *)arg;
    int i;
    long r;
    sigset_t empty;

    /* Signal dispositions: back to default (handlers of the parent must not run here;
     * SIG_IGN from the parent, e.g. Python's SIGPIPE, must not leak into the turn). */
    for (i = 1; i < _NSIG; i++) {
        struct sigaction sa;
        if (i == SIGKILL || i == SIGSTOP) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        /* glibc's sigaction is a thin wrapper (no thread broadcast); errors on the
         * reserved real-time signals are expected and ignored. */
        sigaction(i, &sa, NULL);
    }

    if (syscall(SYS_setsid) < 0) return fail(a, ST_SETSID, errno);
    if (a->netns_fd >= 0 && syscall(SYS_setns, a->netns_fd, CLONE_NEWNET) < 0)
        return fail(a, ST_SETNS, errno);
    if (a->n_cgroups > 0) {
        char buf[32];
        size_t n = fmt_pid(buf, syscall(SYS_getpid));
        for (i = 0; i < a->n_cgroups; i++) {
            if (syscall(SYS_write, a->cgroup_fds[i], buf, n) < 0) return fail(a, ST_CGROUP, errno);
        }
    }
    for (i = 0; i < a->n_rlimits; i++) {
        if (syscall(SYS_prlimit64, 0, a->rlimits[i].resource, &a->rlimits[i].limit, NULL) < 0)
            return fail(a, ST_RLIMIT, errno);
    }
    if (a->gid >= 0) {
        if (syscall(SYS_setgroups, 0, NULL) < 0) return fail(a, ST_SETGROUPS, errno);
        if (syscall(SYS_setresgid, a->gid, a->gid, a->gid) < 0) return fail(a, ST_SETGID, errno);
    }
    if (a->uid >= 0 && syscall(SYS_setresuid, a->uid, a->uid, a->uid) < 0)
        return fail(a, ST_SETUID, errno);
    if (syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail(a, ST_NO_NEW_PRIVS, errno);
    if (a->cwd != NULL && syscall(SYS_chdir, a->cwd) < 0) return fail(a, ST_CHDIR, errno);
    if (a->landlock_fd >= 0) {
        if (syscall(SYS_landlock_restrict_self, a->landlock_fd, a->landlock_flags) < 0)
            return fail(a, ST_LANDLOCK, errno);
    }
    for (i = 0; i < 3; i++) {
        if (syscall(SYS_dup3, a->stdio[i], i, 0) < 0 && a->stdio[i] != i)
            return fail(a, ST_STDIO, errno);
        if (a->stdio[i] == i) {
            /* same fd: only clear close-on-exec */
            r = syscall(SYS_fcntl, i, F_SETFD, 0);
            if (r < 0) return fail(a, ST_STDIO, errno);
        }
    }
    if (a->seccomp_prog != NULL) {
        struct hs_fprog prog;
        unsigned long flags = a->notify_sock >= 0 ? HS_SECCOMP_FILTER_FLAG_NEW_LISTENER : 0;
        prog.len = a->seccomp_len;
        prog.filter = a->seccomp_prog;
        r = syscall(SYS_seccomp, HS_SECCOMP_SET_MODE_FILTER, flags, &prog);
        if (r < 0) return fail(a, ST_SECCOMP, errno);
        if (a->notify_sock >= 0) {
            /* SCM_RIGHTS by hand: no CMSG_* helpers that might touch libc state */
            union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
            } control;
            struct msghdr msg;
            struct iovec iov;
            char byte = 'L';
            int listener = (int)r;
            memset(&control, 0, sizeof control);
            memset(&msg, 0, sizeof msg);
            iov.iov_base = &byte;
            iov.iov_len = 1;
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            control.h.cmsg_level = SOL_SOCKET;
            control.h.cmsg_type = SCM_RIGHTS;
            control.h.cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(&control.h), &listener, sizeof(int));
            if (syscall(SYS_sendmsg, a->notify_sock, &msg, 0) < 0)
                return fail(a, ST_NOTIFY_SEND, errno);
            syscall(SYS_close, listener);
        }
    }
    if (syscall(SYS_close_range, 3, ~0U, 0) < 0) {
        int maxfd = 65536;
        for (i = 3; i < maxfd; i++) syscall(SYS_close, i);
    }
    sigemptyset(&empty);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, NULL, _NSIG / 8);
    syscall(SYS_execve, a->path, a->argv, a->envp);
    return fail(a, ST_EXEC, errno);
}

static void free_strv(char **v) { PyMem_Free(v); }

/* Build a NULL-terminated char* vector pointing into the bytes objects of `seq`.
 * The caller keeps `seq` (a list of bytes) alive while the vector is used. */
static char **make_strv(PyObject *seq, const char *what) {
    Py_ssize_t n, i;
    char **v;
    if (!PyList_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
        return NULL;
    }
    n = PyList_GET_SIZE(seq);
    v = PyMem_Malloc(sizeof(char *) * (size_t)(n + 1));
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(v);
            PyErr_Format(PyExc_TypeError, "%s must be a list of bytes", what);
            return NULL;
        }
        v[i] = PyBytes_AS_STRING(item);
    }
    v[n] = NULL;
    return v;
}

PyDoc_STRVAR(spawn_doc,
"spawn(path, argv, envp, cwd, stdio, cgroup_fds, rlimits, uid, gid, netns_fd, landlock_fd,\n"
"      seccomp=None, notify_sock=-1, newpid=0, landlock_flags=0) -> (pid, pidfd)\n\n"
"Start a confined child (see the module comment). path/cwd are bytes; argv/envp lists of\n"
"bytes; stdio a 3-tuple of fds; cgroup_fds fds of open cgroup.procs files; rlimits a list\n"
"of (resource, soft, hard); uid/gid -1 to keep; netns_fd/landlock_fd -1 for none;\n"
"seccomp the filter program (bytes, 8 per instruction) or None; notify_sock a socket the\n"
"listener fd is sent over (-1: no listener); newpid 1 for a new PID namespace;\n"
"landlock_flags the flags of landlock_restrict_self (audit logging).\n"
"Raises OSError(errno, 'sandbox child failed at <stage>') when a step fails.");

static PyObject *hs_spawn(PyObject *self, PyObject *args) {
    PyObject *path_o, *argv_o, *envp_o, *cwd_o, *cg_o, *rl_o, *sc_o = Py_None;
    int in_fd, out_fd, err_fd, netns_fd, landlock_fd, notify_sock = -1, newpid = 0,
        landlock_flags = 0;
    long uid, gid;
    struct child_args *a = NULL;
    char **argv = NULL, **envp = NULL;
    void *stack = MAP_FAILED;
    sigset_t all, old;
    int pidfd = -1;
    pid_t pid;
    int saved_errno;
    Py_ssize_t i;
    (void)self;

    if (!PyArg_ParseTuple(args, "SO!O!O(iii)O!O!llii|Oiii", &path_o, &PyList_Type, &argv_o,
                          &PyList_Type, &envp_o, &cwd_o, &in_fd, &out_fd, &err_fd,
                          &PyList_Type, &cg_o, &PyList_Type, &rl_o, &uid, &gid, &netns_fd,
                          &landlock_fd, &sc_o, &notify_sock, &newpid, &landlock_flags))
        return NULL;
    if (sc_o != Py_None && (!PyBytes_Check(sc_o) || PyBytes_GET_SIZE(sc_o) % 8 != 0 ||
                            PyBytes_GET_SIZE(sc_o) == 0 || PyBytes_GET_SIZE(sc_o) > 8 * 4096)) {
        PyErr_SetString(PyExc_TypeError, "seccomp must be None or 1..4096 BPF instructions");
        return NULL;
    }
    if (cwd_o != Py_None && !PyBytes_Check(cwd_o)) {
        PyErr_SetString(PyExc_TypeError, "cwd must be bytes or None");
        return NULL;
    }
    if (PyList_GET_SIZE(cg_o) > MAX_CGROUPS || PyList_GET_SIZE(rl_o) > MAX_RLIMITS) {
        PyErr_SetString(PyExc_ValueError, "too many cgroups or rlimits");
        return NULL;
    }
    a = PyMem_Calloc(1, sizeof *a);
    if (a == NULL) return PyErr_NoMemory();
    a->path = PyBytes_AS_STRING(path_o);
    a->cwd = cwd_o == Py_None ? NULL : PyBytes_AS_STRING(cwd_o);
    a->stdio[0] = in_fd;
    a->stdio[1] = out_fd;
    a->stdio[2] = err_fd;
    a->uid = uid;
    a->gid = gid;
    a->netns_fd = netns_fd;
    a->landlock_fd = landlock_fd;
    a->landlock_flags = landlock_flags;
    a->seccomp_prog = sc_o == Py_None ? NULL : PyBytes_AS_STRING(sc_o);
    a->seccomp_len = sc_o == Py_None ? 0 : (unsigned short)(PyBytes_GET_SIZE(sc_o) / 8);
    a->notify_sock = notify_sock;
    a->n_cgroups = (int)PyList_GET_SIZE(cg_o);
    for (i = 0; i < a->n_cgroups; i++) {
        int fd = (int)PyLong_AsLong(PyList_GET_ITEM(cg_o, i));
        if (fd == -1 && PyErr_Occurred()) goto error;
        a->cgroup_fds[i] = fd;
    }
    a->n_rlimits = (int)PyList_GET_SIZE(rl_o);
    for (i = 0; i < a->n_rlimits; i++) {
        int res;
        unsigned long long soft, hard;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(rl_o, i), "iKK", &res, &soft, &hard)) goto error;
        a->rlimits[i].resource = res;
        a->rlimits[i].limit.rlim_cur = (rlim_t)soft;
        a->rlimits[i].limit.rlim_max = (rlim_t)hard;
    }
    argv = make_strv(argv_o, "argv");
    if (argv == NULL) goto error;
    envp = make_strv(envp_o, "envp");
    if (envp == NULL) goto error;

    stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    a->argv = argv;
    a->envp = envp;

    Py_BEGIN_ALLOW_THREADS
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = clone(child_main, (char *)stack + STACK_SIZE,
                CLONE_VM | CLONE_VFORK | CLONE_PIDFD | (newpid ? CLONE_NEWPID : 0) | SIGCHLD, a,
                &pidfd);
    saved_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    Py_END_ALLOW_THREADS

    munmap(stack, STACK_SIZE);
    stack = MAP_FAILED;
    if (pid < 0) {
        errno = saved_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    if (a->err_stage != ST_NONE) {
        int st, stage = a->err_stage, e = a->err_errno;
        char msg[128];
        Py_BEGIN_ALLOW_THREADS
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        Py_END_ALLOW_THREADS
        if (pidfd >= 0) close(pidfd);
        PyOS_snprintf(msg, sizeof msg, "sandbox child failed at %s: %s",
                      stage_names[stage], strerror(e));
        {
            PyObject *exc_args = Py_BuildValue("(is)", e, msg);
            if (exc_args != NULL) {
                PyErr_SetObject(PyExc_OSError, exc_args);
                Py_DECREF(exc_args);
            }
        }
        goto error;
    }
    free_strv(argv);
    free_strv(envp);
    PyMem_Free(a);
    return Py_BuildValue("(ii)", (int)pid, pidfd);

error:
    if (stack != MAP_FAILED) munmap(stack, STACK_SIZE);
    if (argv) free_strv(argv);
    if (envp) free_strv(envp);
    PyMem_Free(a);
    return NULL;
}

static PyMethodDef methods[] = {
    {"spawn", hs_spawn, METH_VARARGS, spawn_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sandbox._spawn",
    "Native launcher for sandboxed process turns (see hunter_spawn.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__spawn(void) { return PyModule_Create(&module); }
