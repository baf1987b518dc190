"""A helper process that imports what a kill test needs once and forks a fresh child per trial.

Starting a new Python that imports torch costs ~1.5 s on a 2-core machine; a kill test that
SIGKILLs 20 savers paid it 20 times. `Forks(script, *args)` runs `script` (which defines
`run(line)`) followed by `FORK_LOOP`: each `start(line)` forks a child that calls `run(line)`,
and `ended()` waits for that child and says how it ended, as `subprocess` return codes do
(0, the exit status, or minus the signal that killed it). The killed process is a real
process killed mid-write, as before; only the import is shared.
"""
from __future__ import annotations

import os
import subprocess
import sys

#: Appended to the script: one line in -> a forked child ("ready PID"; a child that raises
#: prints its traceback and exits 1), then, once it is gone, "ended CODE".
FORK_LOOP = r"""
import os as _os, sys as _sys, traceback as _traceback
for _line in _sys.stdin:
    _pid = _os.fork()
    if _pid == 0:
        print(f"ready {_os.getpid()}", flush=True)
        _code = 0
        try:
            run(_line.rstrip("\n"))
        except BaseException:
            _traceback.print_exc()
            _code = 1
        _os._exit(_code)
    _, _status = _os.waitpid(_pid, 0)
    print(f"ended {-_os.WTERMSIG(_status) if _os.WIFSIGNALED(_status) else _os.WEXITSTATUS(_status)}", flush=True)
"""


class Forks:
    """The helper process (a context manager: killed on exit)."""

    def __init__(self, script: str, *args: str):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", script + FORK_LOOP, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)

    def start(self, line: str) -> int:
        """Fork a child that runs `run(line)`; its pid once it is running."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["ready"], f"the helper said {ready!r} (it died? see its stderr)"
        return int(ready[1])

    def ended(self) -> int:
        """Wait for the child started last: 0, its exit status, or minus the signal that killed it."""
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["ended"], f"the helper said {line!r}"
        return int(line[1])

    def __enter__(self) -> "Forks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
