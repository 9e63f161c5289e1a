"""The launcher of a confined command, and the namespace primitives `sandbox.isolate()` shares.

`cudagym.tasks.sandbox.run_confined` starts this file as `python -I -S confine.py SPEC -- ARGV...`
once per agent shell call, so it imports as little as it can (its start-up is the sandbox's
overhead) and nothing but the standard library. What it does, step by step, is in sandbox.py above
`Confinement`; anything it cannot do ends it with CONFINE_FAILED before the command runs.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWUTS = 0x20000000, 0x08000000, 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
CONFINE_FAILED = 125  # the launcher's exit status when confinement could not be set up
CONFINE_PREFIX = "cudagym-sandbox: "
# Pseudo file systems stay as they are: /dev holds the GPU device nodes, /dev/shm backs shared tensors.
KEEP_WRITABLE = ("/proc", "/sys", "/dev")


def pseudo_fs(mount: str) -> bool:
    """Whether a mount point is one of KEEP_WRITABLE or below one (`/dev/shm`, not `/devdata`)."""
    return any(mount == k or mount.startswith(k + "/") for k in KEEP_WRITABLE)


def load_libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def check_rc(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _confine_and_exec(spec: dict, argv: list[str]) -> None:
    """Set up (the steps are listed in sandbox.py above `Confinement`), fork pid 1, wait, pass its status on."""
    libc = load_libc()
    if os.geteuid() != 0:
        # An unprivileged launcher would need a user namespace for the mounts, and one entered after
        # them to lock them; not built: fail closed rather than run with less than promised.
        raise OSError(1, "confinement needs root (to lock the mounts and then drop to an unprivileged uid)")
    workdir = os.path.realpath(spec["workdir"])
    keep = [workdir] + [os.path.realpath(p) for p in spec["writable"]]
    for path in keep:
        os.makedirs(path, exist_ok=True)
    shown = [p for p in dict.fromkeys(os.path.realpath(p) for p in spec["visible"]) if os.path.isdir(p)]
    check_rc(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    check_rc(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    # Handles on the kept directories before anything is covered: they are bound back from these.
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep + shown}
    hidden = sorted({os.path.realpath(p) for p in spec["hidden"] if os.path.isdir(p)}, key=len)
    covered: list[str] = []
    for path in hidden:
        if path == "/" or any(k == path or path.startswith(k + "/") for k in keep):
            continue  # never cover the root or what must stay visible; a cover above a kept dir is fine
        if any(path.startswith(c + "/") for c in covered):
            continue  # already out of sight under a cover higher up
        covered.append(path)
        check_rc(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755"), f"hide {path}")
    for path, handle in handles.items():
        os.makedirs(path, exist_ok=True)  # inside a cover, the mount point is made anew
        check_rc(libc.mount(f"/proc/self/fd/{handle}".encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if path not in keep else 0)
        check_rc(libc.mount(None, path.encode(), None, flags, None), f"remount {path}")
        os.close(handle)
    for path in spec["read_only"]:
        path = os.path.realpath(path)
        if os.path.lexists(path):
            check_rc(libc.mount(path.encode(), path.encode(), None, MS_BIND, None), f"bind {path}")
    if os.path.isdir("/dev/shm"):
        check_rc(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV,
                          f"size={spec['shm_bytes']},mode=1777".encode()), "private /dev/shm")
    for mount, _ in _mounts():
        if mount not in keep and not pseudo_fs(mount):
            libc.mount(None, mount.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    # Checked, not assumed: a mount that refused to become read-only ends the launch.
    for mount, options in _mounts():
        if mount not in keep and not pseudo_fs(mount) and "ro" not in options:
            raise OSError(1, f"{mount} stayed writable")
    pid = os.fork()
    if pid == 0:
        try:
            _become_command(libc, spec, workdir, argv)
        except BaseException as e:  # noqa: BLE001  (report and end; never run the command half set up)
            os.write(2, f"{CONFINE_PREFIX}{e}\n".encode())
        os._exit(CONFINE_FAILED)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, options) of every mount this process sees."""
    out = []
    with open("/proc/self/mounts") as f:
        table = f.read()
    for line in table.splitlines():
        fields_ = line.split()
        out.append((fields_[1].replace("\\040", " "), set(fields_[3].split(","))))
    return out


def _become_command(libc, spec: dict, workdir: str, argv: list[str]) -> None:
    """pid 1 of the new pid namespace: a fresh /proc, no privileges, limits, then the command."""
    check_rc(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    check_rc(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    os.setgroups([])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    check_rc(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if os.geteuid() == 0 or os.getegid() == 0:
        raise OSError(1, "still root after dropping privileges")
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["max_processes"], spec["max_processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["max_file_bytes"], spec["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir(workdir)
    os.execvpe(argv[0], argv, os.environ)


if __name__ == "__main__":  # the launcher: python -I -S confine.py SPEC -- ARGV...
    import json
    import sys

    try:
        _confine_and_exec(json.loads(sys.argv[1]), sys.argv[sys.argv.index("--") + 1:])
    except BaseException as e:  # noqa: BLE001
        sys.stderr.write(f"{CONFINE_PREFIX}{e}\n")
        sys.stderr.flush()
    os._exit(CONFINE_FAILED)
