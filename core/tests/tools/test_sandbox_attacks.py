"""Attacks on the code interpreter's box, each run through the real tool (``CodeInterpreterTool.execute``) in
both box modes (``bubblewrap``, ``namespaces``; skipped with the probe's reason where this machine cannot build
one). The attack code uses ``ctypes`` / ``_posixsubprocess`` where the audit hook would stop plain Python, as
hostile code would: the box, not the hook, must hold.

Every test here failed against the code interpreter as it was before the box (no namespaces but the network
one, the trainer's uid), except the TCP one, which fails there only where ``unshare`` is refused (that case now
refuses to start: ``test_sandbox_refusal.py``). Nothing here attacks the real trainer: signals go to a helper
process the test starts, writes go to folders the test made, and leftovers are killed and deleted.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import verl
from verl.tools._box_layout import trainer_code_dirs
from verl.tools.code_interpreter import CodeInterpreterTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the boxes are Linux namespaces")


def attack(box: dict, code: str, **config) -> tuple[str, dict]:
    tool = CodeInterpreterTool({"timeout": 20, **box, **config})
    response, _, metrics = asyncio.run(tool.execute("attack", {"code": code}))
    return response.text, metrics


def test_etc_shadow_is_not_there(box):
    text, _ = attack(box, "try:\n    print(open('/etc/shadow').read())\nexcept OSError as e:\n    print('no', e)")
    assert text == "no [Errno 2] No such file or directory: '/etc/shadow'\n"


def test_a_file_in_the_home_folder_is_not_there(box):
    home = Path.home()
    with tempfile.NamedTemporaryFile("w", dir=home, prefix=".verl-sandbox-test-", suffix=".txt") as secret:
        secret.write("home-secret-7f3a")
        secret.flush()
        code = (
            f"import os\ntry:\n    print(open({secret.name!r}).read())\nexcept OSError as e:\n    print('no', e.errno)\n"
            f"print(os.path.exists({str(home)!r}) and os.listdir({str(home)!r}))"
        )
        text, _ = attack(box, code)
    assert "home-secret-7f3a" not in text and Path(secret.name).name not in text
    first, listing = text.splitlines()
    assert first == "no 2"
    # Nothing of the home folder, except the folders leading to an interpreter installed under it (pyenv).
    interpreter = CodeInterpreterTool({"timeout": 5, **box}).isolation.interpreter
    leading = {Path(r).relative_to(home).parts[0] for r in interpreter.roots if Path(r).is_relative_to(home)}
    assert listing == "False" or set(eval(listing)) == leading


def test_the_run_folder_and_the_trainers_working_folder_are_not_there(box, tmp_path):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("run-secret-91c2")
    code = (
        f"import os\nfor p in ({str(run / 'config.yaml')!r}, {str(run)!r}, {os.getcwd()!r}):\n"
        "    print(os.path.exists(p))\n"
        f"try:\n    print(open({str(run / 'config.yaml')!r}).read())\nexcept OSError as e:\n    print('no', e.errno)"
    )
    text, _ = attack(box, code)
    assert text == "False\nFalse\nFalse\nno 2\n"


def test_a_pth_file_cannot_be_planted_in_the_trainers_site_packages(box, tmp_path, monkeypatch):
    # A stand-in site-packages on the trainer's sys.path (never the real one: on a box-less interpreter the
    # write would succeed), and the real ones checked for existence only.
    fake = tmp_path / "lib" / "python3" / "site-packages"
    fake.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(fake))
    real = sorted(d for d in trainer_code_dirs() if "site-packages" in d or "dist-packages" in d)
    assert real, "the trainer has no site-packages folder to check"
    code = (
        f"import os\ntry:\n    open({str(fake / 'evil.pth')!r}, 'w').write('import os; os.system(\"id\")')\n"
        "    print('planted')\nexcept OSError as e:\n    print('no', e.errno)\n"
        f"for d in {real!r}:\n    print(d, os.path.exists(d) and (os.listdir(d), os.access(d, os.W_OK)))"
    )
    text, _ = attack(box, code)
    first, *lines = text.splitlines()
    assert first == "no 2" and not (fake / "evil.pth").exists()
    for d, line in zip(real, lines, strict=True):
        shown = line[len(d) + 1 :]
        assert shown in ("False", "([], False)"), (
            f"{d} is visible in the box: {shown}"
        )  # absent, or empty and read-only


def test_checkpoints_cannot_be_written(box, tmp_path):
    step = tmp_path / "checkpoints" / "global_step_3"
    step.mkdir(parents=True)
    code = (
        f"try:\n    open({str(step / 'data.pt')!r}, 'wb').write(b'pickle payload')\n    print('written')\n"
        "except OSError as e:\n    print('no', e.errno)"
    )
    text, _ = attack(box, code)
    assert text == "no 2\n" and list(step.iterdir()) == []


HELPER = """
import asyncio, json, os, sys
from verl.tools.code_interpreter import CodeInterpreterTool

tool = CodeInterpreterTool({"timeout": 20, **json.loads(sys.argv[1])})
code = (
    "import ctypes, os\\nlibc = ctypes.CDLL(None, use_errno=True)\\n"
    "print('parent', os.getppid(), libc.kill(os.getppid(), 9))\\n"
    f"print('caller', libc.kill({os.getpid()}, 9), ctypes.get_errno())\\n"
)
response, _, metrics = asyncio.run(tool.execute("i", {"code": code}))
print(json.dumps({"text": response.text, "exit_code": metrics["exit_code"]}))
print("caller alive")
"""


def test_ctypes_kill_of_the_parent_does_not_reach_the_caller(box, tmp_path):
    """The caller is a helper process standing in for the trainer (never pytest itself)."""
    helper = tmp_path / "caller.py"
    helper.write_text(HELPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(verl.__file__).parents[1]), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(helper), json.dumps(box)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"the caller died ({done.returncode}): {done.stderr[-2000:]}"
    result, alive = done.stdout.strip().splitlines()[-2:]
    assert alive == "caller alive"
    parent, caller = json.loads(result)["text"].splitlines()
    assert parent == "parent 1 0"  # its parent is the box's PID 1, which ignores the signal
    assert caller == "caller -1 3"  # ESRCH: the caller's pid does not exist in the box


FORK_EXEC = """
import _posixsubprocess, os
r, w = os.pipe()
head = [[b"/bin/sh", b"-c", SCRIPT], [b"/bin/sh"], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, False, False]
for tail in ([-1, None, None, None, -1, None, False], [-1, None, None, None, -1, None], [None, None, None, None]):
    try:
        pid = _posixsubprocess.fork_exec(*head, *tail)  # the interpreter version decides the argument list
        break
    except TypeError:
        continue
os.close(w)
os.waitpid(pid, 0)
"""


def test_posixsubprocess_fork_exec_of_sh_stays_inside(box, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("fork-exec-secret-55b1")
    script = (
        f"cat {secret} 2>&1; cat /etc/shadow 2>&1; echo uid=$(id -u); echo pids $(ls /proc | grep '^[0-9]'); "
        "echo sh-ran"
    )
    text, _ = attack(box, f"SCRIPT = {script.encode()!r}\n" + FORK_EXEC)
    assert "sh-ran" in text  # the shell did run: it is the walls that hold
    assert "fork-exec-secret-55b1" not in text and "root:" not in text
    lines = text.splitlines()
    assert "uid=65534" in lines
    pids = [int(p) for p in next(line for line in lines if line.startswith("pids ")).split()[1:]]
    assert os.getpid() not in pids and max(pids) < 20  # the box's own few processes only


def _named(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            named = entry.name.isdigit() and (entry / "comm").read_text().strip() == marker
            if named and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is dead
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_setsid_grandchild_does_not_outlive_the_call(box):
    marker = f"vgrand{os.getpid() % 100000}"  # a process name keeps 15 characters
    code = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    os.setsid()\n"
        f"    if libc.fork() == 0:\n        libc.prctl(15, {marker!r}.encode(), 0, 0, 0)\n        time.sleep(60)\n"
        "    os._exit(0)\ntime.sleep(0.3)\nprint('left it running')"
    )
    text, _ = attack(box, code)
    deadline = time.monotonic() + 3.0
    while (left := _named(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # never leave it behind, even when the test fails
        os.kill(pid, 9)
    assert left == []
    assert text == "left it running\n"  # and it did not hold the call's output open either


def test_a_fork_bomb_hits_rlimit_nproc(box):
    code = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nn = 0\nfor _ in range(200):\n"
        "    pid = libc.fork()\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    if pid < 0:\n"
        "        print('refused errno', ctypes.get_errno())\n        break\n    n += 1\nprint('forks', n)"
    )
    text, m = attack(box, code, max_processes=10)
    assert "refused errno 11\n" in text  # EAGAIN
    forks = int(text.splitlines()[-1].split()[1])
    assert 0 < forks < 10  # the box's own 2 processes count too
    assert "rlimit_nproc" in m["protections"]["applied"]


def test_tcp_to_a_host_loopback_listener_fails(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (
        "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.socket(2, 1, 0)\n"
        f"addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + socket.inet_aton('127.0.0.1') + bytes(8)\n"
        "rc = libc.connect(fd, addr, 16)\nprint('connect', rc, ctypes.get_errno())"
    )
    try:
        text, _ = attack(box, code)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing arrived
    finally:
        server.close()
    assert text == "connect -1 111\n"  # ECONNREFUSED: the box's own loopback has no listener


def test_the_trainers_environ_is_not_readable(box, monkeypatch):
    monkeypatch.setenv("VERL_TEST_SECRET_TOKEN", "environ-secret-3d9e")
    pid = os.getpid()
    code = (
        f"import os\ntry:\n    print(open('/proc/{pid}/environ', 'rb').read())\nexcept OSError as e:\n"
        "    print('no', e.errno)\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "try:\n    print(open('/proc/1/environ', 'rb').read().count(b'VERL'))\nexcept OSError as e:\n"
        "    print('no', e.errno)"
    )
    text, _ = attack(box, code)
    assert "environ-secret-3d9e" not in text
    first, pids, box_init = text.splitlines()
    assert first == "no 2" and pid not in eval(pids) and len(eval(pids)) <= 3
    assert box_init == "no 13"  # the box's PID 1 (the supervisor) is not readable by the code either


def test_only_the_call_folder_is_writable(box):
    code = (
        "import os\nmounts = [line.split()[4] for line in open('/proc/self/mountinfo')]\n"
        "places = sorted(set(mounts + ['/', '/dev', '/dev/shm', '/etc', '/usr', '/var/tmp', '/proc/sys/kernel']))\n"
        "for place in places:\n    if os.path.isdir(place):\n        try:\n"
        "            open(os.path.join(place, '.w'), 'w').close()\n            print(place)\n"
        "        except OSError:\n            pass"
    )
    text, _ = attack(box, code)
    assert text == "/tmp\n"


def test_no_capabilities_no_nested_user_namespace_no_inherited_descriptors(box):
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print([status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs')])\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\nprint(os.listdir('/proc/self/fd'))"
    )
    text, _ = attack(box, code)
    caps, unshare, fds = text.splitlines()
    assert eval(caps) == ["0000000000000000"] * 3 + ["1"]
    assert unshare in ("-1 28", "-1 1")  # ENOSPC (max_user_namespaces 0) or EPERM
    assert sorted(eval(fds)) == ["0", "1", "2", "3"]  # stdin, stdout, stderr and the listing's own
