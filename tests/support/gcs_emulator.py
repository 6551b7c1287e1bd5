"""A Cloud Storage server on 127.0.0.1 for the bucket tests: gcp-storage-emulator, started in its
own process (tests/support/gcs_emulator_server.py), reached by every client the project uses through
STORAGE_EMULATOR_HOST."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

BUCKET = "ringstripe-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Emulator:
    """with Emulator() as gcs: gcs.env(...) is an environment whose clients use it."""

    def __init__(self, hold_commits=None):
        """hold_commits: a path; while it exists, commit markers are refused
        (tests/support/gcs_emulator_server.py)."""
        self.port = free_port()
        self.hold_commits = hold_commits
        self.host = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "gcs_emulator_server.py"),
             "start", "--host", "127.0.0.1",
             "--port", str(self.port), "--in-memory", "--default-bucket", BUCKET],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, GCS_EMULATOR_HOLD_COMMITS=str(self.hold_commits or "")))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.host}/storage/v1/b/{BUCKET}", timeout=1)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("the GCS emulator exited at start")
                time.sleep(0.2)
        raise RuntimeError("the GCS emulator did not answer in 60 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def env(self, base: dict, mirror: str) -> dict:
        """`base` with this emulator as Cloud Storage and `mirror` as the local mirror root."""
        env = {k: v for k, v in base.items()
               if k not in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING")}
        return dict(env, STORAGE_EMULATOR_HOST=self.host, RINGSTRIPE_MIRROR=str(mirror))

    def listing(self, prefix: str) -> list[str]:
        """Object names under gs://BUCKET/prefix, as the server lists them."""
        import json
        url = f"{self.host}/storage/v1/b/{BUCKET}/o?prefix={prefix}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return [item["name"] for item in json.load(response).get("items", [])]

    def read(self, name: str) -> bytes:
        """The content of gs://BUCKET/name."""
        from urllib.parse import quote
        url = f"{self.host}/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}?alt=media"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read()

    def committed_steps(self, prefix: str) -> list[int]:
        """Checkpoint steps under gs://BUCKET/prefix that Orbax finished (its commit marker)."""
        steps = set()
        for name in self.listing(prefix):
            step, _, rest = name[len(prefix):].partition("/")
            if step.isdigit() and rest == "commit_success.txt":
                steps.add(int(step))
        return sorted(steps)

    def write(self, name: str, content: bytes) -> None:
        """Uploads `content` as gs://BUCKET/name (a simple media upload)."""
        from urllib.parse import quote
        url = (f"{self.host}/upload/storage/v1/b/{BUCKET}/o?uploadType=media"
               f"&name={quote(name, safe='')}")
        request = urllib.request.Request(url, data=content, method="POST",
                                         headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request, timeout=10).close()

    def delete(self, name: str) -> None:
        from urllib.parse import quote
        url = f"{self.host}/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}"
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()
