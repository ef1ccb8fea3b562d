"""The test servers' start-up (server.py) without SGLang: a stand-in `python` whose first start finds its port taken
(as when the other server's internal ports take it first) and whose second serves /health."""

from __future__ import annotations

import sys
import textwrap

from tests.sglang_setup.server import SGLangServer

FAKE = textwrap.dedent("""\
    import http.server, pathlib, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    marker = pathlib.Path(sys.argv[0]).with_name("started-once")
    if not marker.exists():
        marker.write_text("")
        print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already "
              "in use", flush=True)
        sys.exit(1)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def test_a_port_taken_before_the_bind_is_retried_on_another(tmp_path):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {script} \"$@\"\n")  # drop `-m sglang.launch_server`
    python.chmod(0o755)
    server = SGLangServer(str(python), tmp_path / "model", tmp_path)
    first = server.port
    server.start()
    try:
        server.wait(timeout=60)
        assert server.healthy() and server.startup_seconds is not None
        assert server.port != first and server.url == f"http://127.0.0.1:{server.port}"
        assert "address already in use" in (tmp_path / f"sglang-{first}.log").read_text()
    finally:
        server.stop()
    assert server.proc.poll() is not None
