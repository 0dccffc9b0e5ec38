"""``CodeInterpreterTool`` end to end: real ``python -I`` children under real limits (each run 50-150 ms), in each
isolation mode this machine can build (``bubblewrap``, ``namespaces``; skipped with the reason where it cannot)
and in the opt-out ``unsafe_none``.

Covers output, tracebacks, the wall-clock kill (timed), rlimits (memory, CPU, file size, open files), the audit
hook (network, processes, signals), the network namespace, the throw-away folder, the scrubbed environment, the
output cap, cancellation, the kill of every descendant, concurrency across event loops and the config checks.
The attacks on the box are in ``test_sandbox_attacks.py``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from verl.tools.code_interpreter import CodeInterpreterTool
from verl.tools.sandbox import SandboxLimits, ThreadSafeSemaphore, run_python

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs process groups and rlimits")
MB = 1024 * 1024


def make(mode: dict | None = None, **config) -> CodeInterpreterTool:
    """A tool in isolation ``mode`` (a config dict from the ``mode`` fixture; None: the default, ``auto``)."""
    return CodeInterpreterTool({"timeout": 5, **(mode or {}), **config})


def execute(tool: CodeInterpreterTool, code: str):
    response, reward, metrics = asyncio.run(tool.execute("i", {"code": code}))
    assert reward == 0.0
    return response.text, metrics


BOX_PROTECTIONS = {
    "user_namespace",
    "mount_namespace",
    "pid_namespace",
    "network_namespace",
    "ipc_namespace",
    "uts_namespace",
    "uid(65534)",
    "no_capabilities",
    "no_new_privs",
    "die_with_parent",
    "rlimit_nproc",
}


def test_stdout_then_stderr_and_the_protections_report(mode):
    text, m = execute(make(mode), "import sys\nprint('out', 6 * 7)\nprint('err', file=sys.stderr)")
    assert text == "out 42\nerr\n"
    assert (m["exit_code"], m["timed_out"], m["truncated"]) == (0, False, False)
    protections = m["protections"]
    assert protections["isolation"] == mode["isolation"]
    for name in ("audit_hook", "rlimit_core", "rlimit_as", "rlimit_cpu", "rlimit_fsize", "rlimit_nofile"):
        assert name in protections["applied"]
    if mode["isolation"] == "unsafe_none":
        assert "box" in protections["skipped"]
        assert set(protections["skipped"]) <= {"box", "network_namespace", "rlimit_nproc"}  # unshare may be refused
    else:
        assert protections["skipped"] == {}
        assert set(protections["applied"]) >= BOX_PROTECTIONS


def test_exception_traceback_shows_the_code_line_and_no_sandbox_frames(mode):
    text, m = execute(make(mode), "x = 1\ny = x / 0\n")
    assert m["exit_code"] == 1
    assert text.startswith('Traceback (most recent call last):\n  File "<code>", line 2, in <module>\n    y = x / 0\n')
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_sandbox_child" not in text
    text, m = execute(make(mode), "def f(:\n")
    assert "SyntaxError" in text and m["exit_code"] == 1
    text, m = execute(make(mode), "raise SystemExit(3)")
    assert (text, m["exit_code"]) == ("", 3)


def test_infinite_loop_is_killed_at_the_timeout(mode):
    tool = make(mode, timeout=1)
    start = time.monotonic()
    text, m = execute(tool, "print('started')\nwhile True:\n    pass\n")
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 1.0 + 2.0
    assert m["timed_out"] and m["exit_code"] == -9
    # unbuffered output: what was printed before the kill is kept
    assert text == "started\nTimeoutError: killed after 1 s (the code interpreter's time limit)\n"


def test_memory_limit_stops_a_memory_bomb_and_is_what_stops_it(mode):
    code = "block = bytearray(300 * 1024 * 1024)\nprint(len(block))"
    text, m = execute(make(mode, memory_limit_mb=128), code)
    assert "MemoryError" in text and m["exit_code"] == 1
    text, m = execute(make(mode, memory_limit_mb=2048), code)  # zero pages: no real memory is used
    assert text == f"{300 * MB}\n"


def test_cpu_limit_kills_with_sigxcpu(mode):
    text, m = execute(make(mode, timeout=10, cpu_time_s=1), "while True:\n    pass\n")
    assert m["exit_code"] == -24 and not m["timed_out"]  # SIGXCPU, before the 10 s wall clock
    assert text == "[killed by signal SIGXCPU]\n"


def test_file_size_and_open_file_limits(mode):
    text, _ = execute(make(mode, file_size_limit_mb=1), "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert "OSError: [Errno 27] File too large" in text
    text, _ = execute(make(mode, max_open_files=20), "files = [open('f%d' % i, 'w') for i in range(40)]")
    assert "OSError: [Errno 24] Too many open files" in text


@pytest.fixture
def listener():
    """A listening socket on 127.0.0.1: a connection to it must never arrive."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    yield server
    server.close()


def _no_connection_arrived(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


@pytest.mark.parametrize("namespace", [True, False])
def test_network_is_refused(listener, mode, namespace):
    if not namespace and mode["isolation"] != "unsafe_none":
        pytest.skip("network_namespace: false is refused with a box (test_config_checks_of_the_isolation_keys)")
    port = listener.getsockname()[1]
    tool = make(mode, network_namespace=namespace)
    text, _ = execute(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')")
    assert "PermissionError: socket.getaddrinfo is not allowed" in text and "ok" not in text
    text, _ = execute(tool, f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('ok')")
    assert "PermissionError: socket.connect is not allowed" in text and "ok" not in text
    text, _ = execute(tool, "import socket\nsocket.socket().bind(('127.0.0.1', 0))")
    assert "PermissionError: socket.bind is not allowed" in text
    assert _no_connection_arrived(listener)


def test_network_namespace_hides_every_interface_but_loopback(mode):
    text, m = execute(make(mode), "import socket\nprint(sorted(name for _, name in socket.if_nameindex()))")
    if "network_namespace" in m["protections"]["skipped"]:  # unsafe_none only: a box refuses to start without
        pytest.skip(f"this kernel refuses unshare: {m['protections']['skipped']['network_namespace']}")
    assert any(p.startswith("network_namespace") for p in m["protections"]["applied"])
    assert text == "['lo']\n"
    if mode["isolation"] == "unsafe_none":
        text, m = execute(make(mode, network_namespace=False), "print('x')")
        assert m["protections"]["skipped"]["network_namespace"].startswith("disabled by config")


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import subprocess\nsubprocess.run(['ls'])", "subprocess.Popen"),
        ("import os\nos.system('true')", "os.system"),
        ("import os\nos.fork()", "os.fork"),
        ("import os\nos.execv('/bin/ls', ['ls'])", "os.exec"),
        ("import os\nos.posix_spawn('/bin/ls', ['ls'], {})", "os.posix_spawn"),
        ("import multiprocessing as mp\nmp.get_context('fork').Process(target=print).start()", "os.fork"),
    ],
)
def test_new_processes_are_refused(mode, code, event):
    text, m = execute(make(mode), code)
    assert f"PermissionError: {event} is not allowed in the code interpreter" in text
    assert m["exit_code"] == 1


def test_signals_only_to_itself(mode):
    text, _ = execute(make(mode), "import os\nos.kill(os.getppid(), 0)")
    assert "PermissionError: os.kill of another process is not allowed" in text
    text, m = execute(make(mode), "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert m["exit_code"] == -15 and text == "[killed by signal SIGTERM]\n"


def test_files_land_in_a_folder_that_is_gone_afterwards(mode, call_root):
    code = (
        "import os\nopen('out.txt', 'w').write('data')\nos.mkdir('sub')\nos.chmod('sub', 0)\n"
        "print(os.getcwd())\nprint(os.environ['HOME'] == os.getcwd() == os.environ['TMPDIR'])\nprint(os.listdir('.'))"
    )
    text, _ = execute(make(mode), code)
    workdir, same, listing = text.splitlines()
    assert same == "True" and sorted(eval(listing)) == ["out.txt", "sub"]
    if mode["isolation"] == "unsafe_none":
        assert Path(workdir).parent.parent == call_root
    else:
        assert workdir == "/tmp"  # the call's folder as the box shows it
    assert list(call_root.iterdir()) == []  # the call's folder is gone, whatever it held


def test_environment_is_scrubbed(mode, monkeypatch):
    monkeypatch.setenv("VERL_TEST_SECRET_TOKEN", "s3cret")
    text, _ = execute(make(mode), "import os\nprint(sorted(os.environ))")
    assert "VERL_TEST_SECRET_TOKEN" not in text and "s3cret" not in text
    assert eval(text) == sorted(
        ["HOME", "LANG", "LC_ALL", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PATH", "TMPDIR"]
    )
    text, _ = execute(make(mode), "import sys\nprint(sys.stdin.read() == '', sys.flags.isolated)")
    assert text == "True 1\n"


def test_output_cap_keeps_the_first_bytes_and_stops_the_program(mode):
    start = time.monotonic()
    text, m = execute(make(mode, timeout=10, max_output_bytes=1000), "while True:\n    print('y' * 99)\n")
    assert time.monotonic() - start < 5.0  # stopped at the cap, long before the 10 s limit
    assert m["truncated"] and not m["timed_out"]
    assert text == ("y" * 99 + "\n") * 10 + "[output truncated: more than 1000 bytes; the program was stopped]\n"


def _named(marker: str) -> list[int]:
    """Host pids of live processes whose name (``/proc/<pid>/comm``) is ``marker``; zombies count as dead."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == marker and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, waiting for whoever inherited it to reap it) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return not stat.parent.parent.is_dir()  # no /proc (macOS): os.kill said it exists


def _gone(marker: str, within_s: float = 3.0) -> list[int]:
    """Wait up to ``within_s`` for every process named ``marker`` to end; returns (and kills) any left."""
    deadline = time.monotonic() + within_s
    while (left := _named(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # never leave them behind, even when the test fails
        os.kill(pid, 9)
    return left


NAME_ITSELF = "import ctypes\nctypes.CDLL(None).prctl(15, {marker!r}.encode(), 0, 0, 0)  # PR_SET_NAME\n"

needs_proc = pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="needs Linux /proc")


@needs_proc
def test_cancelled_call_kills_its_process_and_removes_its_folder(mode, call_root):
    marker = f"vcancel{os.getpid() % 100000}"  # a process name keeps 15 characters
    code = NAME_ITSELF.format(marker=marker) + "import time\nopen('started', 'w').close()\ntime.sleep(60)"

    async def main():
        task = asyncio.ensure_future(make(mode).execute("i", {"code": code}))
        while not list(call_root.glob("*/work/started")):
            await asyncio.sleep(0.02)
        assert _named(marker)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _gone(marker) == []
    assert list(call_root.iterdir()) == []


@needs_proc
def test_descendants_die_with_the_call_even_after_a_ctypes_fork(mode):
    """ctypes bypasses the audit hook; the process-group kill (unsafe_none) or the end of the box's PID
    namespace still gets the child it forked (the setsid() escape is in test_sandbox_attacks.py)."""
    marker = f"vforked{os.getpid() % 100000}"
    code = (
        "import ctypes, os, time\npid = ctypes.CDLL(None).fork()\nif pid == 0:\n"
        f"    ctypes.CDLL(None).prctl(15, {marker!r}.encode(), 0, 0, 0)\n    time.sleep(30)\n    os._exit(0)\n"
        "def named():\n    try:\n        return open(f'/proc/{pid}/comm').read().strip()\n    except OSError:\n"
        "        return None\n"
        f"while named() != {marker!r}:\n    time.sleep(0.01)\nprint(pid)"
    )
    text, m = execute(make(mode), code)
    assert int(text.strip()) > 0 and m["exit_code"] == 0
    assert _gone(marker) == []


def test_concurrent_runs_are_all_correct_and_bounded(usable):
    tool = make(usable, max_concurrency=2)

    async def main():
        start = time.monotonic()
        code = "import time\ntime.sleep(0.3)\nprint({i} * {i})"
        results = await asyncio.gather(*(tool.execute(f"s{i}", {"code": code.format(i=i)}) for i in range(6)))
        return results, time.monotonic() - start

    results, elapsed = asyncio.run(main())
    assert [r[0].text for r in results] == [f"{i * i}\n" for i in range(6)]
    assert elapsed >= 3 * 0.3  # 6 runs, 2 at a time: at least 3 rounds of 0.3 s


def test_semaphore_across_threads_and_loops_and_cancellation():
    sem = ThreadSafeSemaphore(2)
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "done": 0}

    async def hold():
        async with sem:
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(0.05)
            with lock:
                state["now"] -= 1
                state["done"] += 1

    def worker():
        async def many():
            await asyncio.gather(*(hold() for _ in range(4)))

        asyncio.run(many())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert state == {"now": 0, "max": 2, "done": 12}

    async def cancelled_waiter_keeps_no_permit():
        await sem.acquire()
        await sem.acquire()
        waiter = asyncio.ensure_future(sem.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        sem.release()
        sem.release()
        await asyncio.wait_for(sem.acquire(), 1)  # both permits are free again
        await asyncio.wait_for(sem.acquire(), 1)

    asyncio.run(cancelled_waiter_keeps_no_permit())
    with pytest.raises(ValueError, match="value=0 must be an int >= 1"):
        ThreadSafeSemaphore(0)


def test_agent_loop_timeout_covers_the_queue_and_config_errors(usable):
    assert make(usable, timeout=10).timeout_s == 60 + 4 * 10
    assert make(usable, tool_timeout=7).timeout_s == 7.0
    assert make(usable, cpu_time_s=3).limits.cpu_seconds() == 3
    assert make(usable, timeout=2.5).limits.cpu_seconds() == 4  # ceil(2.5) + 1
    assert make(usable, max_processes=5).limits.processes == 5
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['memory_mb'\]"):
        make(memory_mb=1)
    with pytest.raises(ValueError, match=r"config.memory_limit_mb=0 must be a positive integer"):
        make(memory_limit_mb=0)
    with pytest.raises(ValueError, match=r"config.max_processes=0 must be a positive integer"):
        make(max_processes=0)
    with pytest.raises(ValueError, match=r"config.max_concurrency=0 must be an integer >= 1"):
        make(max_concurrency=0)
    with pytest.raises(ValueError, match=r"config.timeout=0 must be a positive number"):
        make(timeout=0)
    with pytest.raises(ValueError, match=r"config.python='/no/such/python' is not an executable interpreter"):
        make(python="/no/such/python")
    with pytest.raises(TypeError, match="'code' must be a string of Python, got int"):
        asyncio.run(make(usable).execute("i", {"code": 5}))


def test_config_checks_of_the_isolation_keys():
    with pytest.raises(ValueError, match=r"config.isolation='none' is not a mode; use one of \['auto', 'bubblewrap', "):
        make(isolation="none")
    for isolation in ("auto", "bubblewrap", "namespaces"):
        with pytest.raises(ValueError, match=rf"network_namespace=false with isolation={isolation}: the box always"):
            make(isolation=isolation, network_namespace=False)
    tool = make(isolation="unsafe_none", network_namespace=False)  # the opt-out may also drop the namespace
    assert tool.isolation.mode == "unsafe_none" and not tool.limits.network_namespace


def test_run_python_directly_and_its_errors(usable):
    isolation = make(usable).isolation
    result = asyncio.run(run_python("print('x')", SandboxLimits(timeout_s=5), isolation))
    assert (result.stdout, result.stderr, result.exit_code) == ("x\n", "", 0)
    assert result.protections["isolation"] == isolation.mode
    with pytest.raises(TypeError, match="code must be str"):
        asyncio.run(run_python(b"print(1)", None, isolation))
    with pytest.raises(ValueError, match="output_bytes=0 must be a positive int"):
        SandboxLimits(output_bytes=0)
    with pytest.raises(ValueError, match="processes=0 must be a positive int"):
        SandboxLimits(processes=0)


def test_one_tool_shared_by_event_loops_in_several_threads(usable):
    """The agent manager's layout: num_workers threads, each with its own event loop, one tool object."""
    tool = make(usable, max_concurrency=2)
    results: dict[int, list[str]] = {}

    def worker(w: int) -> None:
        async def many():
            calls = [tool.execute(f"{w}-{i}", {"code": f"print({w} * 10 + {i})"}) for i in range(3)]
            return [r[0].text for r in await asyncio.gather(*calls)]

        results[w] = asyncio.run(many())

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {w: [f"{w * 10 + i}\n" for i in range(3)] for w in range(3)}


def test_the_call_folder_goes_whatever_the_program_did_to_it(tmp_path):
    """A folder without permissions and links out of the tree: all removed, nothing outside touched (the retry
    path runs when the trainer is not root; root removes it in one pass)."""
    from verl.tools._box_launch import _remove_tree

    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    outside.chmod(0o600)
    tree = tmp_path / "call"
    (tree / "work" / "locked" / "deeper").mkdir(parents=True)
    (tree / "work" / "locked" / "link").symlink_to(outside)
    (tree / "work" / "locked" / "deeper" / "f").write_text("x")
    (tree / "work" / "locked" / "deeper").chmod(0)
    (tree / "work" / "locked").chmod(0o500)
    _remove_tree(str(tree))
    assert not tree.exists()
    assert outside.read_text() == "keep" and (outside.stat().st_mode & 0o777) == 0o600
