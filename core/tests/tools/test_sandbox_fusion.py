"""``SandboxFusionTool`` against ``FakeSandboxFusion``, a local ``http.server`` **stand-in** for a sandbox-fusion
server: it records each request and answers in sandbox-fusion's JSON shape (``status``, ``run_result``), so the
tests check verl's request fields, the reply text, the 504 retries and the errors; not that any code runs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from verl.tools import sandbox_fusion
from verl.tools.config import load_tools
from verl.tools.sandbox_fusion import SandboxFusionError, SandboxFusionTool, call_sandbox_api


class FakeSandboxFusion:
    """Stand-in server. ``answers`` maps a code string to ``(http status, JSON body)``; others get a run that
    finished with stdout ``"ran: <code>"``. ``fail_504`` answers 504 that many times first."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answers: dict[str, tuple[int, object]] = {}
        self.fail_504 = 0
        self.delay_s = 0.0
        self.in_flight = self.max_in_flight = 0
        lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    fake.requests.append({"path": self.path, "body": body, "type": self.headers["Content-Type"]})
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    retry = fake.fail_504 > 0
                    fake.fail_504 -= int(retry)
                time.sleep(fake.delay_s)
                status, answer = (504, {}) if retry else fake.answers.get(body["code"], (200, None))
                if answer is None:
                    run = {"status": "Finished", "stdout": f"ran: {body['code']}", "stderr": "", "return_code": 0}
                    answer = {"status": "Success", "run_result": {**run, "execution_time": 0.01}}
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with lock:
                    fake.in_flight -= 1

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/run_code"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeSandboxFusion()
    yield server
    server.close()


def execute(tool, code, **params):
    response, reward, metrics = asyncio.run(tool.execute("i", {"code": code, **params}))
    assert reward == 0.0
    return response.text, metrics


def test_request_is_verls_and_a_finished_run_replies_stdout_plus_stderr(fake):
    tool = SandboxFusionTool({"sandbox_fusion_url": fake.url, "default_timeout": 7, "memory_limit_mb": 256})
    run = {"status": "Finished", "stdout": "5\n", "stderr": "warn\n", "return_code": 0, "execution_time": 0.2}
    fake.answers["print(2+3)"] = (200, {"status": "Success", "run_result": run})
    text, metrics = execute(tool, "print(2+3)")
    assert text == "5\nwarn\n"
    assert metrics == {"run_status": "Finished", "timed_out": False, "duration_s": 0.2}
    (request,) = fake.requests
    assert request["path"] == "/run_code" and request["type"] == "application/json"
    assert request["body"] == {
        "compile_timeout": 7.0,
        "run_timeout": 7.0,
        "code": "print(2+3)",
        "stdin": None,
        "memory_limit_MB": 256,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
    execute(tool, "x", timeout=3, language="cpp")  # per-call overrides (verl)
    assert (fake.requests[1]["body"]["run_timeout"], fake.requests[1]["body"]["language"]) == (3, "cpp")


@pytest.mark.parametrize(
    ("run", "reply"),
    [
        (
            {"status": "TimeLimitExceeded", "stdout": "partial", "stderr": ""},
            "partial\nTimeoutError: killed after 30 s (the sandbox's time limit)\n",
        ),
        (
            {"status": "Finished", "stdout": "", "stderr": "Traceback...\nZeroDivisionError\n", "return_code": 1},
            "Traceback...\nZeroDivisionError\n",
        ),
        ({"status": "Error", "stdout": None, "stderr": None}, "[sandbox run status: Error]\n"),
    ],
)
def test_other_run_statuses_keep_the_output_and_say_why(fake, run, reply):
    tool = SandboxFusionTool({"sandbox_fusion_url": fake.url})
    fake.answers["c"] = (200, {"status": "Failed", "run_result": run})
    text, metrics = execute(tool, "c")
    assert text == reply
    assert metrics["timed_out"] is (run["status"] == "TimeLimitExceeded")


def test_gateway_timeouts_are_retried_with_verls_delays(fake, monkeypatch):
    sleeps = []
    monkeypatch.setattr(sandbox_fusion, "_sleep", sleeps.append)
    tool = SandboxFusionTool({"sandbox_fusion_url": fake.url})
    fake.fail_504 = 2
    assert execute(tool, "a")[0] == "ran: a"
    assert len(fake.requests) == 3 and sleeps == [1.0, 2.0]
    fake.fail_504 = 3
    with pytest.raises(SandboxFusionError, match=r"HTTP 504 \(gateway timeout\) on attempt 3/3"):
        execute(tool, "b")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((500, {"detail": "boom"}), "answered HTTP 500"),
        ((200, {"status": "SandboxError", "message": "no worker"}), "SandboxError: no worker"),
        ((200, {"status": "Failed", "compile_result": {"stderr": "bad syntax"}}), "did not run the code: bad syntax"),
        ((200, [1, 2]), "answered list, not a JSON object"),
        ((200, b"<html>"), "not JSON"),
    ],
)
def test_server_failures_raise_a_clear_error(fake, answer, message):
    fake.answers["c"] = answer
    with pytest.raises(SandboxFusionError, match=message):
        execute(SandboxFusionTool({"sandbox_fusion_url": fake.url}), "c")


def test_unreachable_server():
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/run_code"
        with pytest.raises(SandboxFusionError, match="is unreachable"):
            call_sandbox_api(url, "1", run_timeout=1, memory_limit_mb=64)


def test_concurrency_is_min_of_workers_and_rate_limit(fake):
    fake.delay_s = 0.15
    tool = SandboxFusionTool({"sandbox_fusion_url": fake.url, "num_workers": 5, "rate_limit": 2})
    assert tool.max_concurrency == 2

    async def many():
        return await asyncio.gather(*(tool.execute(str(i), {"code": f"c{i}"}) for i in range(6)))

    results = asyncio.run(many())
    assert [r[0].text for r in results] == [f"ran: c{i}" for i in range(6)]
    assert fake.max_in_flight == 2
    no_limit = SandboxFusionTool({"sandbox_fusion_url": fake.url, "num_workers": 5, "enable_global_rate_limit": False})
    assert no_limit.max_concurrency == 5


def test_config_checks_and_verl_yaml(tmp_path, fake):
    with pytest.raises(ValueError, match=r"sandbox_fusion_url=None must be the server's http\(s\) URL"):
        SandboxFusionTool({})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['url'\]"):
        SandboxFusionTool({"url": fake.url})
    with pytest.raises(ValueError, match="default_timeout=0 must be a positive number"):
        SandboxFusionTool({"sandbox_fusion_url": fake.url, "default_timeout": 0})
    tool = SandboxFusionTool({"sandbox_fusion_url": fake.url, "default_timeout": 10})
    assert tool.timeout_s == 3 * (2 * 10 + 10) + 1 + 2  # three attempts' HTTP timeouts and the two delays
    # verl's own tool file (sandbox_fusion_tool_config.yaml at 3467d90ae^), with the URL pointed at the stand-in
    verl_entry = {
        "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "config": {
            "sandbox_fusion_url": fake.url,
            "num_workers": 10,
            "enable_global_rate_limit": True,
            "rate_limit": 10,
            "default_timeout": 30,
            "default_language": "python",
            "memory_limit_mb": 1024,
            "type": "native",
        },
        "tool_schema": SandboxFusionTool.default_tool_schema,
    }
    path = Path(tmp_path / "sf.yaml")
    path.write_text(yaml.safe_dump({"tools": [verl_entry]}))
    (loaded,) = load_tools(path)
    assert isinstance(loaded, SandboxFusionTool) and loaded.name == "code_interpreter"
