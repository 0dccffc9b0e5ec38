"""``CodeInterpreterTool`` end to end: real ``python -I`` children under real limits (each run ~50 ms).

Covers output, tracebacks, the wall-clock kill (timed), rlimits (memory, CPU, file size, open files), the audit
hook (network, processes, signals), the network namespace, the throw-away folder, the scrubbed environment, the
output cap, cancellation, the process-group kill, concurrency across event loops and the config checks.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from verl.tools.code_interpreter import CodeInterpreterTool
from verl.tools.sandbox import SandboxLimits, ThreadSafeSemaphore, run_python

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs process groups and rlimits")
MB = 1024 * 1024


def make(**config) -> CodeInterpreterTool:
    return CodeInterpreterTool({"timeout": 5, **config})


def execute(tool: CodeInterpreterTool, code: str):
    response, reward, metrics = asyncio.run(tool.execute("i", {"code": code}))
    assert reward == 0.0
    return response.text, metrics


def test_stdout_then_stderr_and_the_protections_report():
    text, m = execute(make(), "import sys\nprint('out', 6 * 7)\nprint('err', file=sys.stderr)")
    assert text == "out 42\nerr\n"
    assert (m["exit_code"], m["timed_out"], m["truncated"]) == (0, False, False)
    applied = m["protections"]["applied"]
    for name in ("audit_hook", "rlimit_core", "rlimit_as", "rlimit_cpu", "rlimit_fsize", "rlimit_nofile"):
        assert name in applied
    assert set(m["protections"]["skipped"]) <= {"network_namespace"}  # the kernel may refuse unshare


def test_exception_traceback_shows_the_code_line_and_no_sandbox_frames():
    text, m = execute(make(), "x = 1\ny = x / 0\n")
    assert m["exit_code"] == 1
    assert text.startswith('Traceback (most recent call last):\n  File "<code>", line 2, in <module>\n    y = x / 0\n')
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_sandbox_child" not in text
    text, m = execute(make(), "def f(:\n")
    assert "SyntaxError" in text and m["exit_code"] == 1
    text, m = execute(make(), "raise SystemExit(3)")
    assert (text, m["exit_code"]) == ("", 3)


def test_infinite_loop_is_killed_at_the_timeout():
    tool = make(timeout=1)
    start = time.monotonic()
    text, m = execute(tool, "print('started')\nwhile True:\n    pass\n")
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 1.0 + 2.0
    assert m["timed_out"] and m["exit_code"] == -9
    # unbuffered output: what was printed before the kill is kept
    assert text == "started\nTimeoutError: killed after 1 s (the code interpreter's time limit)\n"


def test_memory_limit_stops_a_memory_bomb_and_is_what_stops_it():
    code = "block = bytearray(300 * 1024 * 1024)\nprint(len(block))"
    text, m = execute(make(memory_limit_mb=128), code)
    assert "MemoryError" in text and m["exit_code"] == 1
    text, m = execute(make(memory_limit_mb=2048), code)  # zero pages: no real memory is used
    assert text == f"{300 * MB}\n"


def test_cpu_limit_kills_with_sigxcpu():
    text, m = execute(make(timeout=10, cpu_time_s=1), "while True:\n    pass\n")
    assert m["exit_code"] == -24 and not m["timed_out"]  # SIGXCPU, before the 10 s wall clock
    assert text == "[killed by signal SIGXCPU]\n"


def test_file_size_and_open_file_limits():
    text, _ = execute(make(file_size_limit_mb=1), "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert "OSError: [Errno 27] File too large" in text
    text, _ = execute(make(max_open_files=20), "files = [open('f%d' % i, 'w') for i in range(40)]")
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
def test_network_is_refused(listener, namespace):
    port = listener.getsockname()[1]
    tool = make(network_namespace=namespace)
    text, _ = execute(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')")
    assert "PermissionError: socket.getaddrinfo is not allowed" in text and "ok" not in text
    text, _ = execute(tool, f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('ok')")
    assert "PermissionError: socket.connect is not allowed" in text and "ok" not in text
    text, _ = execute(tool, "import socket\nsocket.socket().bind(('127.0.0.1', 0))")
    assert "PermissionError: socket.bind is not allowed" in text
    assert _no_connection_arrived(listener)


def test_network_namespace_hides_every_interface_but_loopback():
    text, m = execute(make(), "import socket\nprint(sorted(name for _, name in socket.if_nameindex()))")
    if "network_namespace" in m["protections"]["skipped"]:
        pytest.skip(f"this kernel refuses unshare: {m['protections']['skipped']['network_namespace']}")
    assert any(p.startswith("network_namespace(") for p in m["protections"]["applied"])
    assert text == "['lo']\n"
    text, m = execute(make(network_namespace=False), "print('x')")
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
def test_new_processes_are_refused(code, event):
    text, m = execute(make(), code)
    assert f"PermissionError: {event} is not allowed in the code interpreter" in text
    assert m["exit_code"] == 1


def test_signals_only_to_itself():
    text, _ = execute(make(), "import os\nos.kill(os.getppid(), 0)")
    assert "PermissionError: os.kill of another process is not allowed" in text
    text, m = execute(make(), "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert m["exit_code"] == -15 and text == "[killed by signal SIGTERM]\n"


def test_files_land_in_a_folder_that_is_gone_afterwards():
    code = (
        "import os\nopen('out.txt', 'w').write('data')\nos.mkdir('sub')\nos.chmod('sub', 0)\n"
        "print(os.getcwd())\nprint(os.environ['HOME'] == os.getcwd() == os.environ['TMPDIR'])\nprint(os.listdir('.'))"
    )
    text, _ = execute(make(), code)
    workdir, same, listing = text.splitlines()
    assert same == "True" and sorted(eval(listing)) == ["out.txt", "sub"]
    assert not Path(workdir).exists() and not Path(workdir).parent.exists()


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("VERL_TEST_SECRET_TOKEN", "s3cret")
    text, _ = execute(make(), "import os\nprint(sorted(os.environ))")
    assert "VERL_TEST_SECRET_TOKEN" not in text and "s3cret" not in text
    assert eval(text) == sorted(
        ["HOME", "LANG", "LC_ALL", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PATH", "TMPDIR"]
    )
    text, _ = execute(make(), "import sys\nprint(sys.stdin.read() == '', sys.flags.isolated)")
    assert text == "True 1\n"


def test_output_cap_keeps_the_first_bytes_and_stops_the_program():
    start = time.monotonic()
    text, m = execute(make(timeout=10, max_output_bytes=1000), "while True:\n    print('y' * 99)\n")
    assert time.monotonic() - start < 5.0  # stopped at the cap, long before the 10 s limit
    assert m["truncated"] and not m["timed_out"]
    assert text == ("y" * 99 + "\n") * 10 + "[output truncated: more than 1000 bytes; the program was stopped]\n"


def test_cancelled_call_kills_its_process_and_removes_its_folder(tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()) + ' ' + os.getcwd())\ntime.sleep(60)"

    async def main():
        task = asyncio.ensure_future(make().execute("i", {"code": code}))
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    pid, workdir = pid_file.read_text().split(" ", 1)
    assert not _alive(int(pid))
    assert not Path(workdir).exists()


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


def test_process_group_is_killed_even_after_a_ctypes_fork(tmp_path):
    """ctypes bypasses the audit hook (as the module docstring says); the group kill still gets the child."""
    marker = tmp_path / "grandchild"
    code = (
        "import ctypes, os, time\npid = ctypes.CDLL(None).fork()\nif pid == 0:\n    time.sleep(1.0)\n"
        f"    open({str(marker)!r}, 'w').write('alive')\n    os._exit(0)\nprint(pid)"
    )
    text, m = execute(make(), code)
    grandchild = int(text.strip())
    assert grandchild > 0 and m["exit_code"] == 0
    time.sleep(1.3)
    assert not marker.exists() and not _alive(grandchild)


def test_concurrent_runs_are_all_correct_and_bounded():
    tool = make(max_concurrency=2)

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


def test_agent_loop_timeout_covers_the_queue_and_config_errors():
    assert make(timeout=10).timeout_s == 60 + 4 * 10
    assert make(tool_timeout=7).timeout_s == 7.0
    assert make(cpu_time_s=3).limits.cpu_seconds() == 3
    assert make(timeout=2.5).limits.cpu_seconds() == 4  # ceil(2.5) + 1
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['memory_mb'\]"):
        make(memory_mb=1)
    with pytest.raises(ValueError, match=r"config.memory_limit_mb=0 must be a positive integer"):
        make(memory_limit_mb=0)
    with pytest.raises(ValueError, match=r"config.max_concurrency=0 must be an integer >= 1"):
        make(max_concurrency=0)
    with pytest.raises(ValueError, match=r"config.timeout=0 must be a positive number"):
        make(timeout=0)
    with pytest.raises(ValueError, match=r"config.python='/no/such/python' is not an executable interpreter"):
        make(python="/no/such/python")
    with pytest.raises(TypeError, match="'code' must be a string of Python, got int"):
        asyncio.run(make().execute("i", {"code": 5}))


def test_run_python_directly_and_its_errors():
    result = asyncio.run(run_python("print('x')", SandboxLimits(timeout_s=5, python=sys.executable)))
    assert (result.stdout, result.stderr, result.exit_code) == ("x\n", "", 0)
    with pytest.raises(TypeError, match="code must be str"):
        asyncio.run(run_python(b"print(1)"))
    with pytest.raises(ValueError, match="output_bytes=0 must be a positive int"):
        SandboxLimits(output_bytes=0)


def test_one_tool_shared_by_event_loops_in_several_threads():
    """The agent manager's layout: num_workers threads, each with its own event loop, one tool object."""
    tool = make(max_concurrency=2)
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
