/* Native stack on a crash or a hang, for hosts with no gdb (the H200 machines here).
 *
 *   cc -shared -fPIC -O0 -o /tmp/native_backtrace.so benchmarks/native_backtrace.c -ldl
 *   LD_PRELOAD=/tmp/native_backtrace.so timeout -s USR1 -k 10 60 python3 ...
 *
 * SIGSEGV/SIGBUS/SIGABRT/SIGILL/SIGFPE print the faulting thread's frames and exit; SIGUSR1
 * (what `timeout -s USR1` sends at its limit) prints the frames of the thread that took it,
 * so a hang shows where it waits. Each frame: object, symbol+offset, and the address relative
 * to the object's load base, which `addr2line -f -C -e OBJECT ADDRESS` turns into a line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void print_frames(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    char line[1024];
    int len = snprintf(line, sizeof line, "\n=== native_backtrace: signal %d (%s), %d frames ===\n",
                       sig, strsignal(sig), n);
    write(2, line, len);
    for (int i = 0; i < n; i++) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_fname) {
            len = snprintf(line, sizeof line, "#%-2d %s  %s+0x%lx  [rel 0x%lx]\n", i, info.dli_fname,
                           info.dli_sname ? info.dli_sname : "?",
                           info.dli_saddr ? (unsigned long)((char *)frames[i] - (char *)info.dli_saddr) : 0UL,
                           (unsigned long)((char *)frames[i] - (char *)info.dli_fbase));
        } else {
            len = snprintf(line, sizeof line, "#%-2d ?  %p\n", i, frames[i]);
        }
        write(2, line, len);
    }
}

static void on_signal(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    char line[128];
    int len = snprintf(line, sizeof line, "fault address %p\n", si ? si->si_addr : NULL);
    write(2, line, len);
    print_frames(sig);
    if (sig == SIGUSR1) return;
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    int signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGUSR1};
    for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; i++) sigaction(signals[i], &sa, NULL);
}
