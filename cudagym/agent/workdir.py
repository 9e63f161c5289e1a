"""A rollout's working directory: the task, the agent's files, SKILL.md, and the thin commands.

    WORKDIR/
      model.py       the task (reference Model, get_inputs, get_init_inputs)        protected
      SKILL.md       the workflow, the op policy, the tools, the reward             protected
      verify         asks the environment to check model_new.py (no judge inside)   protected
      profile        asks the environment to time it                               protected
      .cudagym/      the environment's socket for those two commands                protected
      model_new.py   the agent's ModelNew (starts as the reference renamed)
      kernels/       the agent's C++/CUDA sources and headers
      .build/ .tmp/  the agent's build cache (TORCH_EXTENSIONS_DIR) and TMPDIR in the shell

The judge receives model_new.py and every C++/CUDA source or header under kernels/ (`candidate_files`);
it writes them side by side, so model_new.py finds its sources through `os.path.dirname(__file__)`
in the workdir and in the judge alike. Protected files belong to root and are read-only bind mounts
in the shell's sandbox; their hashes are checked before every verify, profile and final verdict.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import threading
import tokenize
from importlib import resources
from pathlib import Path

from cudagym.eval.evaluate import CANDIDATE_FILE_SUFFIXES
from cudagym.tasks import Task

PROTECTED = ("model.py", "SKILL.md", "verify", "profile")
CONTROL_DIR = ".cudagym"  # the environment's own folder in the workdir (its socket); read-only to the agent
SOCKET_NAME = "env.sock"
BUILD_DIR, TMP_DIR, KERNELS_DIR = ".build", ".tmp", "kernels"
MAX_CANDIDATE_BYTES = 2 * 2**20  # model_new.py and kernels/ together, as sent to the judge
MAX_CANDIDATE_FILES = 200  # files under kernels/ sent to the judge

STARTER_HEADER = '''\
# model_new.py: your solution. The judge imports this file and uses class ModelNew (the same
# constructor and forward arguments as Model in model.py). This starting version is the reference's
# torch code renamed: correct, but the strict op policy rejects it (torch compute in forward).
# Put your C++/CUDA sources in kernels/ and build them here, for example:
#
#   import os
#   from torch.utils.cpp_extension import load
#   KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
#   my_ext = load(name="my_ext", sources=[os.path.join(KERNELS, "my_kernel.cu")])
#
# Only model_new.py and the C++/CUDA files under kernels/ reach the judge. See SKILL.md.
'''


class WorkdirError(ValueError):
    """A path the agent may not use, or a candidate that cannot be sent to the judge (one line)."""


class FileTooBig(WorkdirError):
    """A workdir file past the bytes a reader takes (`read_inside`)."""


FIRST_UID, N_UIDS = 200_000, 100_000
_CLAIMED: set[int] = set()  # uids of this process's live environments
_CLAIM_LOCK = threading.Lock()


def sandbox_ids(workdir: Path) -> tuple[int, int]:
    """The unprivileged uid/gid of a workdir's shell: one per workdir (from its path, the next free one
    if this process already uses it), so one rollout's fork bomb spends its own RLIMIT_NPROC, and the
    processes left of a call are its own. Processes on one host draw from the same 100,000 uids."""
    n = int(hashlib.sha256(str(workdir).encode()).hexdigest(), 16) % N_UIDS
    with _CLAIM_LOCK:
        while FIRST_UID + n in _CLAIMED:
            n = (n + 1) % N_UIDS
        _CLAIMED.add(FIRST_UID + n)
    return FIRST_UID + n, FIRST_UID + n


def release_ids(uid: int) -> None:
    with _CLAIM_LOCK:
        _CLAIMED.discard(uid)


def starter_model_new(task_code: str) -> str:
    """The task's code with Model renamed ModelNew (every `Model` name token, so `super(Model, self)`
    follows), under a header that says what to do with it."""
    lines = task_code.splitlines(keepends=True)
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(task_code).readline)
                  if t.type == tokenize.NAME and t.string == "Model"]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        tokens = []
    for tok in reversed(tokens):  # right to left: earlier columns stay valid
        row, col = tok.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "ModelNew" + line[col + len("Model"):]
    return STARTER_HEADER + "\n" + "".join(lines)


def create_workdir(task: Task, workdir: Path, uid: int, gid: int) -> dict[str, str]:
    """Make the workdir from scratch (a resumed rollout starts over); returns the protected files' hashes."""
    if workdir.exists() or workdir.is_symlink():
        if workdir.is_symlink() or not workdir.is_dir():
            workdir.unlink()
        else:
            shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    template = resources.files("cudagym.agent") / "template"
    (workdir / "model.py").write_text(task.code)
    (workdir / "SKILL.md").write_text(template.joinpath("SKILL.md").read_text())
    for command in ("verify", "profile"):
        (workdir / command).write_text(template.joinpath("command.py").read_text().replace("{TOOL}", command))
    (workdir / "model_new.py").write_text(starter_model_new(task.code))
    for name in (KERNELS_DIR, BUILD_DIR, TMP_DIR):
        (workdir / name).mkdir()
    (workdir / CONTROL_DIR).mkdir()
    # The agent's shell runs as uid: it owns its files and the folder; root keeps the protected ones.
    # (Without root there is no shell to give them to: it fails closed, see cudagym.tasks.sandbox.)
    for path in [workdir, workdir / "model_new.py"] + [workdir / n for n in (KERNELS_DIR, BUILD_DIR, TMP_DIR)]:
        if os.geteuid() == 0:
            os.chown(path, uid, gid)
    for name in PROTECTED:
        (workdir / name).chmod(0o555 if name in ("verify", "profile") else 0o444)
    (workdir / CONTROL_DIR).chmod(0o755)
    return protected_hashes(workdir)


def protected_hashes(workdir: Path) -> dict[str, str]:
    return {name: _sha256(workdir / name) for name in PROTECTED}


def changed_protected(workdir: Path, hashes: dict[str, str]) -> list[str]:
    """Names of protected files that changed or went missing since the workdir was made."""
    return [name for name, digest in hashes.items() if _sha256(workdir / name) != digest]


def _sha256(path: Path) -> str:
    try:
        if path.is_symlink() or not path.is_file():
            return "missing or not a file"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def resolve(workdir: Path, path: str, must_exist: bool = False) -> Path:
    """An agent-given path as an absolute path inside the workdir, or WorkdirError. Refused: `..`,
    absolute paths elsewhere, and anything whose real path (symlinks followed) leaves the workdir."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise WorkdirError("a non-empty path is expected")
    if ".." in Path(path).parts:
        raise WorkdirError(f"{path}: '..' is not allowed; paths are relative to the workdir")
    root = workdir.resolve()
    candidate = Path(path) if os.path.isabs(path) else root / path
    if not os.path.abspath(candidate).startswith(str(root) + os.sep) and os.path.abspath(candidate) != str(root):
        raise WorkdirError(f"{path}: outside the workdir ({root})")
    real = Path(os.path.realpath(candidate))
    if real != root and not str(real).startswith(str(root) + os.sep):
        raise WorkdirError(f"{path}: a symlink that leads outside the workdir")
    if must_exist and not real.exists():
        raise WorkdirError(f"{path}: no such file")
    return real


def is_protected(workdir: Path, path: Path) -> bool:
    rel = path.relative_to(workdir.resolve())
    return rel.parts[:1] == (CONTROL_DIR,) or (len(rel.parts) == 1 and rel.parts[0] in PROTECTED)


def _open_inside(root: Path, path: Path, flags: int) -> int:
    """A descriptor of regular file `path`, opened so that nothing the agent's processes do meanwhile
    (./verify runs while they live) can redirect it: no symlink followed at the last step, no wait on
    a FIFO or device (O_NONBLOCK, and anything but a regular file refused), and the file actually
    opened must lie under `root`, checked on the descriptor itself (a folder swapped for a symlink
    after the path was checked is caught)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WorkdirError(f"{path.relative_to(root) if path.is_relative_to(root) else path}: not a regular file")
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not real.startswith(str(root) + os.sep):
            raise WorkdirError(f"{path.relative_to(root) if path.is_relative_to(root) else path}: leads outside the workdir")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_inside(root: Path, path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of regular file `path` under `root` (see _open_inside); WorkdirError past max_bytes."""
    fd = _open_inside(root, path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        if max_bytes is None:
            return f.read()
        data = f.read(max_bytes + 1)  # the file may grow while it is read: never take more than the bound
        if len(data) > max_bytes:
            raise FileTooBig(f"{path.relative_to(root)} has more than {max_bytes >> 10} KiB")
        return data


def write_inside(root: Path, path: Path, text: str) -> None:
    """Create or replace regular file `path` under `root` with `text` (see _open_inside: truncated only
    once the open file is known to be the workdir's own)."""
    fd = _open_inside(root, path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(text.encode())


def candidate_sources(workdir: Path) -> tuple[str, dict[str, str], list[str]]:
    """(model_new.py, {kernels/...: text} for the judge, kernels/ files left out and why)."""
    root = workdir.resolve()
    main = root / "model_new.py"
    if main.is_symlink() or not main.is_file():
        raise WorkdirError("model_new.py is missing (write it with write_file)")
    budget = MAX_CANDIDATE_BYTES
    try:
        code = read_inside(root, main, budget).decode(errors="replace")
    except WorkdirError:
        raise WorkdirError(f"model_new.py is not a regular file of at most {MAX_CANDIDATE_BYTES >> 10} KiB") from None
    budget -= len(code.encode())
    files, left_out = {}, []
    for dirpath, dirnames, filenames in os.walk(root / KERNELS_DIR):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                left_out.append(f"{rel} (a symlink)")
            elif not name.endswith(CANDIDATE_FILE_SUFFIXES):
                left_out.append(f"{rel} (not a C++/CUDA source or header)")
            elif len(files) >= MAX_CANDIDATE_FILES:
                left_out.append(f"{rel} (more than {MAX_CANDIDATE_FILES} files)")
            else:
                try:  # a huge file is never read past the budget; a FIFO or a swapped link is not read at all
                    data = read_inside(root, path, budget)
                except FileTooBig:
                    raise WorkdirError(f"model_new.py and kernels/ hold more than {MAX_CANDIDATE_BYTES >> 10} KiB; "
                                       "that much does not go to the judge") from None
                except WorkdirError as e:
                    left_out.append(f"{rel} ({str(e).split(': ', 1)[-1]})")
                    continue
                except OSError as e:
                    left_out.append(f"{rel} (unreadable: {e.strerror})")
                    continue
                budget -= len(data)
                files[rel] = data.decode(errors="replace")
    return code, files, left_out


def chown_new(workdir: Path, path: Path, uid: int, gid: int) -> None:
    """Give a file the environment wrote (and the folders it made) to the shell's uid, so the agent's
    shell can change what its file tools wrote."""
    root = workdir.resolve()
    while os.geteuid() == 0 and path != root and str(path).startswith(str(root) + os.sep):
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except OSError:
            pass
        path = path.parent
