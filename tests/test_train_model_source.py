"""--model that names nothing this machine can load is refused at once with one line (exit 2), and a Hub model held in
the local cache loads from it when the Hub does not answer. The Hub is a closed port on 127.0.0.1 (HF_ENDPOINT) and
the cache an empty folder (HF_HOME), so nothing here reaches the network."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_HUB = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def _env(hf_home: Path, endpoint: str = NO_HUB) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(hf_home), "PYTHONPATH": str(ROOT)}


def test_a_model_neither_local_nor_cached_nor_served_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "train", "--model", "nobody/no-such-model", "--max-steps", "1", "--output-dir",
         str(out)],
        cwd=ROOT, env=_env(tmp_path / "hf"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "--model 'nobody/no-such-model'" in errors[0]
    assert "no local folder, not in the Hugging Face cache, and the Hub could not be reached" in errors[0]
    assert "hf download nobody/no-such-model" in errors[0]


def _cache(hf_home: Path, repo: str) -> None:
    """The layout huggingface_hub's cache has after a download of `repo`'s config.json (refs/main -> a snapshot)."""
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123abcd")
    (folder / "snapshots" / "0123abcd").mkdir(parents=True)
    (folder / "snapshots" / "0123abcd" / "config.json").write_text(json.dumps({"model_type": "llama"}))


def _hub_source(tmp_path: Path, name: str, endpoint: str = NO_HUB) -> subprocess.CompletedProcess:
    code = f"import json; from train.model import hub_source; print(json.dumps(hub_source({name!r})))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(tmp_path / "hf", endpoint),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_cached_model_loads_from_the_cache_when_the_hub_does_not_answer(tmp_path):
    _cache(tmp_path / "hf", "someone/cached-model")
    proc = _hub_source(tmp_path, "someone/cached-model")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == {"local_files_only": True}
    assert "the Hugging Face Hub could not be reached for 'someone/cached-model'" in lines[0]
    assert "loading it from the local cache" in lines[0]


def test_a_local_folder_never_asks_the_hub(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    proc = _hub_source(tmp_path, str(folder))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "{}"


class _Hub(http.server.BaseHTTPRequestHandler):
    """A Hub that answers every request with the status (and X-Error-Code) of its class attributes."""

    status, error_code = 404, None

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status)
        if self.error_code:
            self.send_header("X-Error-Code", self.error_code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _hub(status: int, error_code: str | None):
    handler = type("Hub", (_Hub,), {"status": status, "error_code": error_code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_hub_that_answers_otherwise_is_left_to_transformers(tmp_path):
    """A mirror that serves the files but not the Hub's API (a plain 404 there): transformers tries its downloads."""
    with _hub(404, None) as endpoint:
        proc = _hub_source(tmp_path, "me/mirrored-model", endpoint)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "{}"


def test_a_model_the_hub_refuses_names_the_login(tmp_path):
    """A private or gated model without a login (401, RepoNotFound): refused, saying that a login is needed; with its
    config in the cache, loaded from there, saying that the Hub refused it."""
    with _hub(401, "RepoNotFound") as endpoint:
        proc = _hub_source(tmp_path, "me/private-model", endpoint)
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert "ModelUnavailable: --model 'me/private-model': no local folder, not in the Hugging Face cache" in last
        assert "the Hub refused it (RepositoryNotFoundError" in last, last
        assert "a private or gated model needs a login (hf auth login, or HF_TOKEN)" in last, last
        _cache(tmp_path / "hf", "me/private-model")
        proc = _hub_source(tmp_path, "me/private-model", endpoint)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "the Hugging Face Hub refused 'me/private-model'" in lines[0], lines
    assert json.loads(lines[-1]) == {"local_files_only": True}


def test_a_name_that_is_no_hub_id_says_so(tmp_path):
    proc = _hub_source(tmp_path, "not a valid//id")
    assert proc.returncode != 0
    assert "--model 'not a valid//id': no local folder, nor a Hugging Face model id" in proc.stderr
