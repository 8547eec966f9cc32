"""The built-in `python` tool: the model's code runs in a separate process with limits.

- time: killed, with every process of its session, after `timeout_s` (or when the tool call is cancelled);
- memory: its address space is capped at `memory_mb` (an allocation past it raises MemoryError);
- output: stdout and stderr together, read as they come; past `max_output_bytes` the process is killed;
- no network: where the kernel lets it, the process gets a network namespace of its own with no interface
  (root, or unprivileged user namespaces); in any case an audit hook, which Python code cannot remove, refuses
  sockets, new processes (fork, exec, subprocess, os.system) and loading native libraries through ctypes;
- a temporary working directory, removed afterwards.

A run that hangs, crashes, floods its output or tries what the hook refuses is one `ToolError` (kinds `timeout`,
`crash`, `output_limit`, `forbidden`), which the multi-turn loop counts and shows the model; the run goes on. An
exception in the model's code is a crash whose traceback the model reads.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import sys
import tempfile

from fasync.rollout.tools import ToolError

_FORBIDDEN_EXIT = 86
"""The exit status of a run the audit hook stopped."""
REAP_S = 10.0
"""The longest the sandbox waits for a killed run's pipe to close (`_reap`)."""

_RUNNER = f"""
import sys
code = sys.stdin.read()
_REFUSED = ("socket.", "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "subprocess.", "pty.", "ctypes.dlopen", "ctypes.dlsym", "os.kill", "os.killpg", "signal.pthread_kill")
_ALLOWED = ("socket.gethostname",)
class _Refused(BaseException):
    pass
def _hook(event, args):
    if event.startswith(_REFUSED) and not event.startswith(_ALLOWED):
        raise _Refused(event)
sys.addaudithook(_hook)
try:
    exec(compile(code, "<tool call>", "exec"), {{"__name__": "__main__"}})
except _Refused as refused:
    sys.stdout.flush()
    sys.stderr.write(f"refused: {{refused}} (the python tool has no network and starts no processes)\\n")
    sys.stderr.flush()
    import os
    os._exit({_FORBIDDEN_EXIT})
"""

_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000


def _isolate(memory_bytes: int) -> None:
    """In the child before it runs Python: the memory cap and, where allowed, a network namespace of its own."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
    except (OSError, AttributeError):
        pass  # the audit hook still refuses sockets


class PythonSandbox:
    """The `python` tool: `await python(code=...)` returns what the code printed (stdout and stderr)."""

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_bytes: int = 16_384):
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes

    async def __call__(self, code: str) -> str:
        workdir = tempfile.mkdtemp(prefix="fasync-python-")
        process = None
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", _RUNNER, cwd=workdir, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "PYTHONIOENCODING": "utf-8"},
                preexec_fn=lambda: _isolate(self.memory_mb << 20))
            process.stdin.write(code.encode())
            process.stdin.close()
            try:
                output = await asyncio.wait_for(self._read(process), self.timeout_s)
            except asyncio.TimeoutError:
                raise ToolError("timeout", f"the code ran longer than {self.timeout_s:g} s and was stopped") from None
            status = await process.wait()
        finally:
            if process is not None:
                await _reap(process)
            shutil.rmtree(workdir, ignore_errors=True)
        text = output.decode(errors="replace")
        if status == _FORBIDDEN_EXIT:
            raise ToolError("forbidden", text[-500:])
        if status != 0:
            ending = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
            raise ToolError("crash", f"{ending}: {text[-500:]}")
        return text

    async def _read(self, process) -> bytes:
        chunks, size = [], 0
        while chunk := await process.stdout.read(65_536):
            size += len(chunk)
            if size > self.max_output_bytes:
                raise ToolError("output_limit", f"the code printed more than {self.max_output_bytes:,} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


async def _reap(process) -> None:
    """Kill the session and wait for the process. What is left in the pipe is read and dropped first: a reader
    that stopped at the output limit leaves asyncio's pipe transport paused on a full buffer, and `wait()` returns
    only once the pipe is closed, so waiting alone could hang. Bounded by `REAP_S`, in case something outside the
    session still holds the pipe (the killed process is then reaped by asyncio's child watcher)."""
    _kill_session(process)
    if process.returncode is not None:
        return

    async def drain_and_wait() -> None:
        while await process.stdout.read(65_536):
            pass
        await process.wait()

    try:
        await asyncio.wait_for(drain_and_wait(), REAP_S)
    except asyncio.TimeoutError:
        pass


def _kill_session(process) -> None:
    """Kill the process and every process of its session (what it started, even if it outlived it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


python = PythonSandbox()
"""The `python` tool with its default limits, for an environment's `tools = {"python": python}`."""
